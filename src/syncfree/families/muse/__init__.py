"""Muse Glimmer: a windowed tower with a learned position table and a pixel shuffle after its encoder, an adapter and a
projection outside it, before Muse's own text model (sliding and NoPE layers), without 3D positions.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* no rotary index: the text model numbers tokens itself and the processor returns no ``mm_token_type_ids`` (the
  EXAONE-4.5 layout: the plan computes no positions, counts placeholders);
* the tower takes ``pixel_values`` and asks stock's helpers for its tables with new parameters, each popped from its
  ``kwargs`` when given: the segments, Qwen2.5-VL's window index with merge 1 (windows of ``pos_emb_height`` patches),
  merge-1 rotary ids (stock flips and shifts them after the pop), the learned table's taps on the h/w-swapped grid with
  ``padding="zeros"`` and ``align_corners=False``, and the pixel-shuffle index. The plan makes all of them on the
  device (``PositionTable.swap_hw`` / ``padding``, ``TowerShape.pixel_shuffle``), checked against stock's helpers once;
* its blocks are called without ``**kwargs``, with the segmentation of their layer type (full or window):
  ``BLOCK_KWARGS_BY_TYPE`` passes the plan's sizes of both on, the attention picks its own by count;
* the adapter and projection sit outside the tower (``vision_every_step`` is refused);
* ``get_image_features`` splits by ``image_grid_thw.prod(-1) // merge_size**2``: on the plan's host grid, no sync.

Muse Spark runs the same tower (its forward is Glimmer's, AST for AST) and placeholder code, before a MoE text model,
and adds an audio tower on raw waveforms: each clip keeps its first ``ceil(real samples / samples_per_token)`` tokens
by a boolean select (``AUDIO_VALID_TOKENS``: by planned positions, from the plan's host copy of
``input_values_mask``), checked and scattered into ``<|audio|>`` placeholders (``AUDIO_PLACEHOLDER_MASK`` /
``AUDIO_SCATTER_EMBEDS``: the plan counts them).
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Text, Video, Waveform, batch_builder, item_grid
from ...plan.hooks import PlanHooks
from ...plan.spec import AudioLayout, Layout, PositionTable, RotaryIndex, TowerShape
from ...rewrite.edits import feature_split
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import (
    family_module,
    installed_source_has,
    vlm_targets,
)
from . import audio_tokens
from .edits import (
    AUDIO_PLACEHOLDER_MASK,
    AUDIO_SCATTER_EMBEDS,
    AUDIO_VALID_TOKENS,
    BLOCK_KWARGS_BY_TYPE,
)

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP", "ITEMS",
           "build_muse_inputs", "MARKERS"]

# What the tower wrapper relies on in the stock forward: its helpers get the caller's kwargs (to pop the plan's
# tables from), and the pixel shuffle gets them too.
# Its tower merges only after its encoder (a pixel shuffle by its ``merge_size``), windows as many patches on a side as
# its position table, and a projector outside it.
_TOWER = TowerShape(merge_attr="merge_size", encoder_merge=1, windows=True, window_from_table=True, pixel_shuffle=True,
                    holds_projector=False)
_TOWER_NEEDS = ("get_vision_cu_seqlens(grid_thw, kwargs=kwargs)", "get_vision_window_index(",
                "get_vision_position_ids(grid_thw", "self.patch_embedder(pixel_values, grid_thw, **kwargs)",
                "self.pixel_shuffle(hidden_states, grid_thw, **kwargs)")


# Spark's real audio samples per clip (one clip per batch row), which give the audio tokens each clip keeps.
PLAN = PlanHooks(inputs=("input_values_mask",), per_row=("input_values_mask",))


def _family(model_type: str, prefix: str, audio: bool = False) -> Family:
    audio_options = dict(model_params=("input_values", "input_values_mask"), model_edits=AUDIO_SCATTER_EMBEDS)
    targets = vlm_targets(
        f"{prefix}VisionAttention", f"{prefix}VisionModel", f"{prefix}Model", f"{prefix}ForConditionalGeneration",
        rope_needs=None, vision_params=("pixel_values", "grid_thw"), base_vision_needs=_TOWER_NEEDS,
        vision_edits=BLOCK_KWARGS_BY_TYPE,
        feature_split=feature_split("self.config.vision_config.merge_size", kinds=("image",)), **(audio_options if audio else {}))
    if audio:
        targets += (Target(f"{prefix}Model", "get_audio_placeholder_mask", edits=AUDIO_PLACEHOLDER_MASK),
                    Target(f"{prefix}Model", "get_audio_features", edits=AUDIO_VALID_TOKENS))
    return Family(model_type, targets,
        Layout(family_module(model_type), rope=RotaryIndex(mrope=False), vision_markers=False, token_types=False,
               table=PositionTable(side="pos_emb_height", align_corners_from=f"{prefix}VisionPatchEmbedder",
                                   swap_hw=True, padding="zeros"),
               tower=_TOWER, audio=AudioLayout(tokens=audio), one_graph=True, stream=True,
               plan=PLAN if audio else PlanHooks()),
        helpers=audio_tokens)


# Registered where the installed forward hands its tower the caller's kwargs and takes encoder outputs (Transformers
# 5.24's); 5.17's older forward differs (its patched logits were not stock's there): left stock.
FAMILIES: tuple[Family, ...] = tuple(
    make() for folder, make in (("muse_glimmer", lambda: _family("muse_glimmer", "MuseGlimmer")),
                                ("muse_spark", lambda: _family("muse_spark", "MuseSpark", audio=True)))
    if installed_source_has(family_module(folder), "mm_encoder_outputs"))

# A tiny model with the real layout rules: patch 14, merge 2 (pixel shuffle), a 4x4 learned table (so windows of 4x4
# patches: images larger than that get several), window layers and a full one, and a text model of 3 sliding layers and
# a NoPE full one.
_GLIMMER_TINY = dict(
    model_type="muse_glimmer", image_token_id=1000, video_token_id=1001, out_hidden_size=128, projector_hidden_size=64,
    vision_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=3, patch_size=14,
                       pos_emb_height=4, pos_emb_width=4, merge_size=2, patch_temporal=2,
                       rope_parameters=dict(rope_type="axial", rope_theta=10000.0)),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, sliding_window=16, max_position_embeddings=4096,
                     pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
# Spark: the same tower, a MoE text model (4 experts, 2 per token) and an audio tower of 8 samples per token.
_SPARK_TINY = dict(
    _GLIMMER_TINY, model_type="muse_spark", audio_token_id=1007,
    audio_config=dict(patch_sizes=[4, 2], hidden_sizes=[16, 32], depths=[1, 1], num_hidden_layers=2,
                      out_hidden_size=64, conv_kernel_size=3),
    text_config=dict(_GLIMMER_TINY["text_config"], moe_intermediate_size=32, moe_hidden_size=32, num_local_experts=4,
                     num_experts_per_tok=2),
)
PRESETS: dict[str, Preset] = {
    "muse-glimmer-tiny": Preset("muse-glimmer-tiny", _GLIMMER_TINY, 0,
                                "tiny Muse Glimmer for tests (window and full tower layers, pixel shuffle)"),
    "muse-spark-tiny": Preset("muse-spark-tiny", _SPARK_TINY, 0,
                              "tiny Muse Spark for tests (Glimmer's tower, MoE text model, audio tower)"),
}
VISION_CLASSES = {"muse_glimmer": "MuseGlimmerVisionModel", "muse_spark": "MuseSparkVisionModel"}

# The processor's marker tokens (its tokenizer's ids; the config names none): ids of the tiny presets' vocabulary.
MARKERS = dict(image_start=1002, image_end=1003, video_start=1004, video_sep=1005, video_end=1006, audio_start=1008,
               audio_end=1009)


ITEMS = (Text, Image, Video, Waveform)  # the items its processor takes (``families.processor_batch`` refuses others)


@batch_builder(ITEMS)
def build_muse_inputs(batch: Draft) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``MuseGlimmerProcessor`` lays them out: an image is ``<|image_start|>``, ``t*h*w // 4``
    ``<|patch|>`` and ``<|image_end|>``; a video is ``<|vid_start|>``, then per temporal group its timestamp
    ``"Time: {s:.1f}s"`` in text and its ``<|video|>`` placeholders, groups joined by ``<|vid_frame_separator|>`` and
    closed by ``<|vid_end|>``. Pixels are flat patches laid out (temporal, channel, patch, patch): an image's one frame
    repeated over the temporal patch. Spark's audio clip (``Waveform``) is ``<|soft_audio_start|>``,
    ``ceil(samples / samples_per_token)`` ``<|audio|>`` and ``<|soft_audio_end|>``; ``input_values`` holds the clips
    right-padded with zeros to the longest, rounded up to a multiple of ``samples_per_token``, and ``input_values_mask``
    (int32) their real samples. No ``mm_token_type_ids``."""
    config, gen = batch.config, batch.gen
    vc = config.vision_config
    patch, merge, tpatch = vc.patch_size, vc.merge_size, vc.patch_temporal
    frame_features = 3 * patch * patch
    audio_token = getattr(config, "audio_token_id", None)
    grids, pixels = {"image": [], "video": []}, {"image": [], "video": []}
    clips: list[int] = []

    def place(row: Row, item: Image | Video | Waveform) -> None:
        if isinstance(item, Waveform):
            if audio_token is None:
                raise ValueError(f"{config.model_type} takes no audio")
            clips.append(item.samples)
            n = -(-item.samples // config.audio_config.samples_per_token)
            row.add([MARKERS["audio_start"]] + [audio_token] * n + [MARKERS["audio_end"]])
            return
        t, h, w = item_grid(item, patch, merge, tpatch)
        per_group = h * w // (merge * merge)
        if isinstance(item, Image):
            grids["image"].append((t, h, w))
            frame = torch.randn(h * w, frame_features, generator=gen)
            pixels["image"].append(frame.repeat(1, tpatch))  # (the processor expands the frame over time)
            row.add([MARKERS["image_start"]] + [config.image_token_id] * per_group + [MARKERS["image_end"]])
            return
        grids["video"].append((t, h, w))
        pixels["video"].append(torch.randn(t * h * w, tpatch * frame_features, generator=gen))
        row.add([MARKERS["video_start"]])
        for g in range(t):
            row.text(len(f"Time: {g * tpatch / item.fps:.1f}s") // 3)  # about as many tokens as a tokenizer makes
            row.add([config.video_token_id] * per_group + [MARKERS["video_sep"] if g < t - 1 else MARKERS["video_end"]])

    specials = {config.image_token_id, config.video_token_id, audio_token, *MARKERS.values()}
    out = batch.packed(batch.rows(place, avoid=specials), typed=False)  # (the processor returns no token types)
    for kind, name in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        if grids[kind]:
            out[name] = torch.cat(pixels[kind])
            out[f"{kind}_grid_thw"] = torch.tensor(grids[kind], dtype=torch.long)
    if clips:
        unit = config.audio_config.samples_per_token
        width = -(-max(clips) // unit) * unit
        out["input_values"] = torch.zeros(len(clips), width)
        out["input_values_mask"] = torch.zeros(len(clips), width, dtype=torch.int32)
        for i, n in enumerate(clips):
            out["input_values"][i, :n] = torch.randn(n, generator=gen)
            out["input_values_mask"][i, :n] = 1
    return out


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_muse_glimmer(config) -> None:
    # The tower's pixel shuffle puts merge**2 patches side by side: the adapter takes that width.
    vision = config.vision_config
    config.out_hidden_size = vision.hidden_size * vision.merge_size**2


CENSUS_FIXES = {"muse_glimmer": _census_fix_muse_glimmer, "muse_spark": _census_fix_muse_glimmer}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_muse_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    census_fixes=CENSUS_FIXES, items=ITEMS,
                    display={"muse_glimmer": "Muse Glimmer", "muse_spark": "Muse Spark"})
