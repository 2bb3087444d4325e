"""Qwen3-ASR: an audio-only model, a Whisper-style audio encoder before a Qwen3 text model (no vision tower, no
image token, no rotary index of its own).

What syncs in stock, and what syncfree does instead:

* the encoder's attention windows (``get_audio_cu_seqlens``: ``.max().item()``, a Python loop over device lengths,
  an upload), its valid output frames (``valid_mask.flatten().nonzero()``) and, in every encoder layer, the window
  sizes (``lengths.tolist()``): all follow from the processor's ``input_features_mask``, of which the plan keeps a
  host copy (``plan``, by stock's own code on that copy). The encoder wrapper hands stock the planned
  ``cu_seqlens`` and ``max_seqlen`` (stock pops both from its kwargs; the latter carries the window sizes to
  ``AUDIO_ATTENTION``) and the valid frames' positions (``ASR_VALID_FRAMES``: ``index_select`` with them takes the
  same rows);
* the placeholder check (a count printed in its message, a boolean select's size) and the scatter
  (``ASR_PLACEHOLDER_MASK`` / ``ASR_SCATTER``): the plan counts the audio placeholders.
"""

from __future__ import annotations

import torch

from ...items import Audio, Draft, Row, Text, batch_builder
from ...plan.spec import AudioLayout, Layout, RotaryIndex
from ...rewrite.edits import AUDIO_ATTENTION
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_generate, make_model_forward
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import family_module, installed_source_has
from . import valid_frames
from .edits import ASR_PLACEHOLDER_MASK, ASR_SCATTER, ASR_VALID_FRAMES
from .plan import PLAN
from .wrappers import make_masked_audio_forward

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "MODEL_CLASSES", "GROUP", "ITEMS",
           "build_asr_inputs", "asr_layout", "ASR_LAYOUT_NAMES", "MARKERS", "audio_tokens", "is_audio_only"]

_MODULE = family_module("qwen3_asr")
_MODEL_PARAMS = ("input_ids", "input_features", "input_features_mask", "attention_mask", "position_ids",
                 "inputs_embeds")
_TARGETS = (
    Target("Qwen3ASRAudioAttention", "forward", edits=AUDIO_ATTENTION),
    Target("Qwen3ASREncoder", "forward", edits=ASR_VALID_FRAMES, wrap=make_masked_audio_forward,
           params=("input_features", "input_features_mask"),
           needs=("get_audio_cu_seqlens(", "kwargs=kwargs", "get_max_seqlen(cu_seqlens, self.config, kwargs=kwargs)",
                  "max_seqlen=max_seqlen, **kwargs", "self._post_cnn_length(")),
    Target("Qwen3ASRModel", "get_placeholder_mask", edits=ASR_PLACEHOLDER_MASK),
    Target("Qwen3ASRModel", "forward", edits=ASR_SCATTER, wrap=make_model_forward, params=_MODEL_PARAMS,
           needs=("self.get_placeholder_mask(", "self.get_audio_features(", "self.language_model(")),
    Target("Qwen3ASRForConditionalGeneration", "generate", wrap=make_generate, inherited=True),
)

# Registered only where Transformers ships the code these targets were written for (the encoder that takes
# input_features_mask and pops its windows from its kwargs).
FAMILIES: tuple[Family, ...] = (
    Family("qwen3_asr", _TARGETS, Layout(_MODULE, rope=RotaryIndex(mrope=False), vision_markers=False,
                                         token_types=False, audio=AudioLayout(tokens=True), plan=PLAN,
                                         one_graph=True, stream=True),
           helpers=valid_frames),
) if installed_source_has(_MODULE, "def get_audio_cu_seqlens(", "input_features_mask: torch.Tensor,",
                          "valid_indices = valid_mask.flatten().nonzero().squeeze(-1)") else ()

# A tiny model with the real layout rules: 100-frame chunks (n_window 50: 13 frames each after the three stride-2
# convolutions, which the processor's token count assumes), attention windows of 2 chunks (n_window_infer 200), 16 mel
# bins, and a Qwen3 text model of 2 layers.
_ASR_TINY = dict(
    model_type="qwen3_asr", audio_token_id=1001, timestamp_token_id=1004, pad_token_id=0, eos_token_id=1005,
    audio_config=dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
                      n_window=50, n_window_infer=200, output_dim=64, downsample_hidden_size=8,
                      max_position_embeddings=13),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, pad_token_id=0,
                     bos_token_id=None, eos_token_id=None, tie_word_embeddings=True),
)
_FAMILY_TYPES = {f.model_type for f in FAMILIES}
PRESETS: dict[str, Preset] = {
    "qwen3-asr-tiny": Preset("qwen3-asr-tiny", _ASR_TINY, 0,
                             "tiny Qwen3-ASR for tests (windowed audio encoder, Qwen3 text model)"),
} if "qwen3_asr" in _FAMILY_TYPES else {}
VISION_CLASSES: dict = {}  # (no vision tower)


def _model_class(model_type: str):
    """Qwen3ASRForConditionalGeneration (no image-text auto class builds it from its config)."""
    import importlib

    return importlib.import_module(_MODULE).Qwen3ASRForConditionalGeneration


MODEL_CLASSES: dict = {"qwen3_asr": _model_class} if "qwen3_asr" in _FAMILY_TYPES else {}

# The processor's marker tokens around a clip's placeholders (its tokenizer's ids; the config names none): ids of the
# tiny preset's vocabulary.
MARKERS = dict(audio_start=1002, audio_end=1003)
_HOP_FRAMES_MIN = 50  # the feature extractor pads a clip to min_length (8000 samples) before its mel frames: 50


def is_audio_only(config) -> bool:
    """True for a registered audio-only family's config (or model type): audio batches, no images."""
    return GROUP.handles(config)


def audio_tokens(config, frames: int) -> int:
    """The placeholders the processor writes for a clip of ``frames`` mel frames (its ``_get_audio_token_length``:
    13 per full 100-frame chunk, the rest through three stride-2 convolutions)."""
    chunk = config.audio_config.n_window * 2
    rest = (frames % chunk - 1) // 2 + 1
    return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13


ITEMS = (Text, Audio)  # the items its processor takes (``families.processor_batch`` refuses others)


@batch_builder(ITEMS)
def build_asr_inputs(batch: Draft) -> dict:
    """A ``Qwen3ASRProcessor`` batch for ``samples`` (``Text`` and ``Audio`` items), without a tokenizer.

    Each clip (``Audio(frames)``: mel frames, 100 a second, at least 50 as the feature extractor pads short clips) is
    ``<|audio_start|>``, its placeholders and ``<|audio_end|>``; rows are padded on ``padding_side`` (the processor's
    default: left). ``input_features`` (clips, mel bins, frames) holds the clips right-padded to the longest, rounded
    up to a multiple of ``2 * n_window`` frames, and ``input_features_mask`` (int32) their real frames."""
    config = batch.config
    ac = config.audio_config
    clips = []

    def place(row: Row, item: Audio) -> None:
        frames = max(item.frames, _HOP_FRAMES_MIN)
        clips.append(frames)
        row.add([MARKERS["audio_start"]] + [config.audio_token_id] * audio_tokens(config, frames) +
                [MARKERS["audio_end"]])

    out = batch.packed(batch.rows(place, avoid={config.audio_token_id, *MARKERS.values()}, low=2),
                       typed=False)  # (its processor returns no token types)
    if clips:
        chunk = ac.n_window * 2
        frames = -(-max(clips) // chunk) * chunk
        mask = torch.zeros(len(clips), frames, dtype=torch.int32)
        for i, n in enumerate(clips):
            mask[i, :n] = 1
        out["input_features"] = torch.randn(len(clips), ac.num_mel_bins, frames, generator=batch.gen) * mask[:, None, :]
        out["input_features_mask"] = mask
    return out


ASR_LAYOUT_NAMES = ("audio", "mixed")


def asr_layout(name: str, seconds: float = 3.0) -> list[list]:
    """Named Qwen3-ASR layouts (one clip per row, as its processor takes them): ``audio``, one clip of ``seconds``;
    ``mixed``, three rows of clips of different lengths (a partial chunk, several windows, a short clip)."""
    frames = max(int(seconds * 100), 1)
    if name == "audio":
        return [[Text(10), Audio(frames), Text(12)]]
    if name == "mixed":
        return [[Text(6), Audio(frames + 17), Text(8)], [Text(5), Audio(frames // 2 + 31), Text(9)],
                [Text(4), Audio(60), Text(3)]]
    raise ValueError(f"unknown Qwen3-ASR input kind {name!r}; choose one of {', '.join(ASR_LAYOUT_NAMES)}")


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_qwen3_asr(config) -> None:
    # The projector after the audio encoder outputs its config's output_dim (the checkpoint's text width), which the
    # shrink leaves at its default: the text width the shrink chose.
    config.audio_config.output_dim = config.text_config.hidden_size


CENSUS_FIXES = {"qwen3_asr": _census_fix_qwen3_asr}


# The group, as the registry reads it (``families.GROUPS``).
# Its batches: The processor's layout: left-padded rows, right-padded clips with their frame mask.
GROUP = FamilyGroup(FAMILIES, build_asr_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    model_classes=MODEL_CLASSES, census_fixes=CENSUS_FIXES, items=ITEMS,
                    display={"qwen3_asr": "Qwen3-ASR"})
