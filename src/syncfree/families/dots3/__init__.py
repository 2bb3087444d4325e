"""dots3-note: a Qwen-style packed tower with MoE blocks and the merger inside it, an audio encoder on packed chunks of
log-mel frames, and a MoE text model with latent attention (sliding and DSA-indexed layers, sized per layer), without
3D positions.

What is its own, beside the Qwen-VL pieces:

* no rotary index: the text model numbers tokens itself and the processor returns no ``mm_token_type_ids`` (the
  EXAONE-4.5 layout: the plan computes no positions, counts placeholders); no markers around an image or a video (its
  chat template writes them): an image is ``h*w/4`` ``<|imgpad|>``, a video ``t*h*w/4`` ``<|video_pad|>`` (its
  processors patch frame by frame: one flat ``(C*p*p)`` row per patch, ``t`` = frames);
* ``get_placeholder_mask(input_ids, inputs_embeds, features, token_id)`` serves every kind through ``token_id``
  (``PLACEHOLDER_BY_ANY_TOKEN_ID``) and the forward scatters ``*_embeddings.to(inputs_embeds)``
  (``FEATURE_SCATTER_EMBEDDINGS``);
* audio: the feature extractor cuts each clip into chunks of ``chunk_length`` seconds, packed along one axis with
  ``chunk_sample_lengths``; a chunk of ``n`` samples has ``ceil(n / samples_per_token)`` ``<|audio_comp_pad|>``. The
  encoder keeps each chunk's first that many frames by a boolean select (``AUDIO_CHUNK_TOKENS``: by planned positions
  from the plan's host copy of ``chunk_sample_lengths``), and generate() groups the chunks by sample for beams
  (``AUDIO_CHUNK_GROUPS``: on the host copies);
* the MoE blocks of the tower and of the text model take PyTorch's grouped matmul in bf16 (no sync); fp32's eager or
  fallback experts read the routing (the MoE remainder every MoE family keeps).
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Text, Video, Waveform, batch_builder, item_grid, pixel_inputs
from ...plan.spec import AudioLayout, Layout, RotaryIndex
from ...rewrite.edits import VISION_ATTENTION, feature_split
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_generate, make_model_forward, make_vision_forward
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import (
    MODEL_NEEDS,
    VISION_NEEDS,
    family_module,
    installed_source_has,
    )
from . import audio_chunks, placeholders
from .edits import AUDIO_CHUNK_GROUPS, AUDIO_CHUNK_TOKENS, FEATURE_SCATTER_EMBEDDINGS, PLACEHOLDER_BY_ANY_TOKEN_ID
from .plan import PLAN

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP", "ITEMS",
           "build_dots3_inputs"]

_P = "Dots3Note"
_MODEL_PARAMS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "pixel_values_videos",
                 "image_grid_thw", "video_grid_thw", "input_features", "chunk_sample_lengths")


def _dots3_note() -> Family:
    targets = (
        Target(f"{_P}VisionAttention", "forward", edits=VISION_ATTENTION),
        Target(f"{_P}VisionModel", "forward", wrap=make_vision_forward, params=("pixel_values", "grid_thw"),
               needs=VISION_NEEDS),
        Target(f"{_P}Model", "get_placeholder_mask", edits=PLACEHOLDER_BY_ANY_TOKEN_ID),
        Target(f"{_P}Model", "get_image_features",
               edits=feature_split("self.vision_tower.spatial_merge_size", kinds=("image",))),
        Target(f"{_P}Model", "forward", edits=FEATURE_SCATTER_EMBEDDINGS, wrap=make_model_forward,
               params=_MODEL_PARAMS, needs=tuple(n for n in MODEL_NEEDS if n != "self.compute_3d_position_ids(")),
        Target(f"{_P}AudioModel", "forward", edits=AUDIO_CHUNK_TOKENS),
        Target(f"{_P}ForConditionalGeneration", "generate", wrap=make_generate, inherited=True),
        Target(f"{_P}ForConditionalGeneration", "_expand_inputs_for_generation", edits=AUDIO_CHUNK_GROUPS),
    )
    return Family("dots3_note", targets, Layout(family_module("dots3_note"), rope=RotaryIndex(mrope=False),
                                                vision_markers=False, token_types=False, audio=AudioLayout(tokens=True),
                                                plan=PLAN, one_graph=True, stream=True),
                  helpers={name: getattr(m, name) for m in (audio_chunks, placeholders) for name in m.__all__})


# Registered where Transformers ships dots3-note with its packed audio chunks (5.24; 5.17 has no such model).
FAMILIES: tuple[Family, ...] = (
    (_dots3_note(),) if installed_source_has(family_module("dots3_note"), "chunk_sample_lengths", "mm_encoder_outputs")
    else ())

# A tiny model with the real layout rules: patch 14, merge 2; a dense tower block and a MoE one (4 experts, 2 per
# patch); a text model of three layers (DSA-indexed, sliding with its own head count and latent ranks, indexed), MoE
# after the first (4 experts in 2 groups, a shared expert), whose indexer keeps 8 keys; an audio encoder of 4 samples
# per mel frame (32 per placeholder) whose feature extractor cuts 60-second chunks of 16 samples a second (30
# placeholders each).
_DOTS3_TINY = dict(
    model_type="dots3_note", image_token_id=1000, video_token_id=1001, audio_token_id=1002,
    vision_config=dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=4, patch_size=14, spatial_merge_size=2, pyramid_num_routed=[-1, 4],
                       capacity_factor=2, adapter_in_dim=32, adapter_out_dim=64, adapter_merge_size=2),
    audio_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      feature_size=16, hop_length=4, sampling_rate=16, downsample_hidden_size=4,
                      adapter_input_size=32, adapter_out_dim=64),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, head_dim=16,
                     qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
                     layer_types=["indexed_attention", "sliding_attention", "indexed_attention"], sliding_window=16,
                     swa_num_attention_heads=2, swa_num_key_value_heads=2, swa_q_lora_rank=32, swa_kv_lora_rank=16,
                     swa_head_dim=16, swa_qk_nope_head_dim=8, swa_qk_rope_head_dim=8, swa_v_head_dim=8,
                     index_n_heads=2, index_head_dim=16, index_topk=8, n_routed_experts=4, n_group=2, topk_group=1,
                     n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_experts_intermediate_size=32, first_k_dense_replace=1, max_position_embeddings=4096,
                     pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
PRESETS: dict[str, Preset] = {
    "dots3-note-tiny": Preset("dots3-note-tiny", _DOTS3_TINY, 0,
                              "tiny dots3-note for tests (MoE tower block, audio chunks, per-layer latent attention)"),
}
VISION_CLASSES = {"dots3_note": "Dots3NoteVisionModel"}


ITEMS = (Text, Image, Video, Waveform)  # the items its processor takes (``families.processor_batch`` refuses others)


@batch_builder(ITEMS)
def build_dots3_inputs(batch: Draft, *, chunk_seconds: int = 60) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``Dots3NoteProcessor`` lays them out: an image is ``t*h*w // 4`` ``<|imgpad|>``, a video
    ``t*h*w // 4`` ``<|video_pad|>`` (one run; ``t`` is its frames), pixels one flat ``(C*p*p)`` row per patch. An
    audio clip (``Waveform``) is cut into chunks of ``chunk_seconds * sampling_rate`` samples (the feature extractor's
    ``chunk_length``); it is ``sum(ceil(chunk / samples_per_token))`` ``<|audio_comp_pad|>``. ``input_features`` holds
    every chunk of the batch, in order, as ``(chunks, mel bins, 8 * most placeholders of a chunk)`` frames (random log
    mels; the encoder masks each chunk's frames past its samples), ``chunk_sample_lengths`` their samples. No
    ``mm_token_type_ids``, no markers."""
    config = batch.config
    vc, ac = config.vision_config, config.audio_config
    patch, merge = vc.patch_size, vc.spatial_merge_size
    grids, chunks = {"image": [], "video": []}, []

    def place(row: Row, item: Image | Video | Waveform) -> None:
        if isinstance(item, Waveform):
            if item.samples <= 0:
                raise ValueError(f"{item}: an audio clip needs samples")
            per_chunk = chunk_seconds * ac.sampling_rate
            for start in range(0, item.samples, per_chunk):
                chunks.append(min(per_chunk, item.samples - start))
                row.add([config.audio_token_id] * -(-chunks[-1] // ac.samples_per_token))
            return
        t, h, w = item_grid(item, patch, merge, 1)
        kind = "image" if isinstance(item, Image) else "video"
        grids[kind].append((t, h, w))
        row.add([config.image_token_id if kind == "image" else config.video_token_id] * (t * h * w // merge**2))

    rows = batch.rows(place, avoid={config.image_token_id, config.video_token_id, config.audio_token_id})
    out = batch.packed(rows, typed=False)  # (the processor returns no token types)
    out.update(pixel_inputs(vc, grids["image"], grids["video"], batch.gen))
    if chunks:
        frames = 8 * max(-(-n // ac.samples_per_token) for n in chunks)
        out["input_features"] = torch.randn(len(chunks), ac.feature_size, frames, generator=batch.gen)
        out["chunk_sample_lengths"] = torch.tensor(chunks, dtype=torch.long)
    return out


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_dots3_note(config) -> None:
    text, vision = config.text_config, config.vision_config
    # Its latent attention's parts, derived once per layer kind (and restated in its sliding layers' overrides): every
    # layer takes the shrunk head, half of it rotary (a sliding layer checks head_dim == nope + rope), latent ranks of
    # the text width, an indexer head of the same size, and each kind's rotary fraction recomputed (rope / head).
    parts = ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank")
    spec = vars(text).get("_heterogeneity_spec")
    kept = {i: {k: v for k, v in o.items() if k not in parts} for i, o in (spec.per_layer_overrides if spec else {}).items()}
    text.per_layer_config = None
    text.qk_rope_head_dim = text.head_dim // 2
    text.qk_nope_head_dim = text.head_dim - text.qk_rope_head_dim
    text.q_lora_rank = text.kv_lora_rank = text.hidden_size
    text.index_head_dim, text.index_n_heads = text.head_dim, 2
    text.per_layer_config = {i: o for i, o in kept.items() if o} or None
    for rope in text.rope_parameters.values():
        rope["partial_rotary_factor"] = text.qk_rope_head_dim / text.head_dim
    # The tower's MoE blocks lie past the shrunk depth (the default routes only its last 17 of 42): its second block is
    # one, of 4 experts.
    vision.mlp_layer_types = ["dense", "sparse"]
    vision.num_local_experts = 4
    # The audio encoder's attention has as many key heads as query heads (derived once).
    config.audio_config.num_key_value_heads = config.audio_config.num_attention_heads


CENSUS_FIXES = {"dots3_note": _census_fix_dots3_note}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_dots3_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    census_fixes=CENSUS_FIXES, items=ITEMS, display={"dots3_note": "dots3-note"})
