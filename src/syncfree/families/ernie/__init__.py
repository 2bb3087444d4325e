"""ERNIE-4.5-VL (MoE): Qwen2-VL's packed tower and rotary index, a resampler after the tower that merges each
video's frames in pairs, and a text model whose MoE layers route text and vision tokens to separate experts.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* the tower is ``vision_tower`` and the projector is a resampler outside it (``resampler_model``), which pairs a
  video's frames (``temporal_merge_size`` 2): a video of t frames has t // 2 frames of placeholders, positions
  and split sizes (``VideoLayout.temporal_merge``); the rotary index is Qwen2-VL's with that division;
* the resampler builds its frame-pairing indices on the host (from the host grid) and moves them with a blocking
  copy: pinned and non-blocking instead (``TEMPORAL_SLICES``);
* the text model's MoE blocks route by ``moe_mm_token_type_ids`` (types that also mark the start/end tokens),
  an input of its own the plan keeps: ``MODALITY_MOE`` answers its "any vision token?" and moves each kind's
  rows by positions instead of boolean masks (its edits in ``edits``, the family's own helpers they call in
  ``modality_moe``: its ``Family.helpers``);
* an image is ``<|IMAGE_START|>`` + placeholders + ``<|IMAGE_END|>``, a video ``<|VIDEO_START|>`` + placeholders +
  ``<|VIDEO_END|>``, with the config's own start/end ids; pixels are (patches, C*P*P), no temporal patch.
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Video, batch_builder, item_grid, pack_rows, pixel_inputs
from ...plan.hooks import PlanHooks
from ...plan.spec import Layout, TowerShape, VideoLayout
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import family_module, vlm_targets
from . import frame_pairs, modality_moe, stream
from .edits import FEATURE_SPLITS, MODALITY_MOE, TEMPORAL_SLICES, TEMPORAL_SLICES_CALL
from .modality_moe import MODALITY_SIZES, modality_counts

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "build_ernie_inputs"]

_P = "Ernie4_5_VLMoe"


# Its MoE routes each token to text or vision experts by ``moe_mm_token_type_ids``: a host copy, so the MoE blocks know
# how many tokens each kind has without asking the device.
# (and counts its vision tokens, which a traced forward's MoE blocks take as an int: ``modality_moe.modality_counts``)
PLAN = PlanHooks(inputs=("moe_mm_token_type_ids",), per_row=("moe_mm_token_type_ids",), fields=modality_counts,
                 sizes=MODALITY_SIZES)


def _ernie() -> Family:
    targets = vlm_targets(f"{_P}VisionAttention", f"{_P}VisionTransformerPretrainedModel", f"{_P}Model",
                          f"{_P}ForConditionalGeneration",
                          rope_needs=("t_merge_size = 1 if modality_type == 1 else temporal_merge_size",),
                          model_params=("moe_mm_token_type_ids",), feature_split=FEATURE_SPLITS)
    targets += (
        Target(f"{_P}MoeBlock", "forward", edits=MODALITY_MOE),
        Target(f"{_P}VariableResolutionResamplerModel", "_temporal_slicing", edits=TEMPORAL_SLICES),
        Target(f"{_P}VariableResolutionResamplerModel", "forward", edits=TEMPORAL_SLICES_CALL),
    )
    layout = Layout(family_module("ernie4_5_vl_moe"), video=VideoLayout(temporal_merge=True),
                    tower=TowerShape(holds_projector=False), plan=PLAN, one_graph=True, stream=True,
                    packing_refused="its batch carries per-token inputs of its own (moe_mm_token_type_ids) that the "
                                    "packing collator does not lay out")
    helpers = {name: getattr(module, name) for module in (modality_moe, frame_pairs, stream) for name in module.__all__}
    return Family("ernie4_5_vl_moe", targets, layout, helpers=helpers)


FAMILIES: tuple[Family, ...] = (_ernie(),)

# A tiny model with the real layout rules: patch 14, merge 2, video frames paired after the tower, a text model of
# one dense and one MoE layer (4 text and 4 vision experts, 2 per token, one shared), M-RoPE sections (h, w, t).
_ERNIE_TINY = dict(
    model_type="ernie4_5_vl_moe", image_token_id=1000, video_token_id=1001, image_start_token_id=1002,
    image_end_token_id=1003, video_start_token_id=1004, video_end_token_id=1005,
    vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=14,
                       spatial_merge_size=2, temporal_merge_size=2, hidden_act="quick_gelu"),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                     rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=[3, 3, 2]),
                     mlp_layer_types=["dense", "sparse"], moe_intermediate_size=[32, 32], moe_k=2, moe_num_experts=4,
                     moe_num_shared_experts=1, pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
# baidu/ERNIE-4.5-VL-28B-A3B in Transformers' format: Transformers' own config defaults, which its conversion script
# from the published checkpoint confirms (rope sections [22, 22, 20]; 64 text and 64 vision experts, 6 per token,
# widths 1536 and 512; 2 shared; layer 0 dense).
_ERNIE_28B = dict(
    model_type="ernie4_5_vl_moe", image_token_id=100295, video_token_id=103367, image_start_token_id=101304,
    image_end_token_id=101305, video_start_token_id=101306, video_end_token_id=101307,
    vision_config=dict(depth=32, hidden_size=1280, intermediate_size=5120, num_heads=16, in_channels=3, patch_size=14,
                       spatial_merge_size=2, temporal_merge_size=2, hidden_act="quick_gelu", rms_norm_eps=1e-6),
    text_config=dict(vocab_size=103424, hidden_size=2560, intermediate_size=12288, num_hidden_layers=28,
                     num_attention_heads=20, num_key_value_heads=4, max_position_embeddings=131072,
                     rms_norm_eps=1e-5, rope_parameters=dict(rope_type="default", rope_theta=500000.0,
                                                             mrope_section=[22, 22, 20]),
                     mlp_layer_types=["dense"] + ["sparse"] * 27, moe_intermediate_size=[1536, 512], moe_k=6,
                     moe_num_experts=64, moe_num_shared_experts=2, moe_norm_min=1e-12),
)
PRESETS: dict[str, Preset] = {
    "ernie4.5-vl-28b-a3b": Preset("ernie4.5-vl-28b-a3b", _ERNIE_28B, 0,
                                  "ERNIE-4.5-VL-28B-A3B (published shapes, as Transformers converts them)"),
    "ernie4.5-vl-tiny": Preset("ernie4.5-vl-tiny", _ERNIE_TINY, 0,
                               "tiny ERNIE-4.5-VL for tests (text and vision experts, paired video frames)"),
}
VISION_CLASSES = {"ernie4_5_vl_moe": f"{_P}VisionTransformerPretrainedModel"}


@batch_builder()
def build_ernie_inputs(batch: Draft) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``Ernie4_5_VLMoeProcessor`` lays them out: start marker, placeholders, end marker per
    image or video (a video of t frames has t // temporal_merge_size frames of placeholders); ``mm_token_type_ids``
    marks the placeholders 1 / 2, ``moe_mm_token_type_ids`` the placeholders and their markers."""
    config = batch.config
    vc = config.vision_config
    patch, merge, tmerge = vc.patch_size, vc.spatial_merge_size, vc.temporal_merge_size
    marks = {1: (config.image_start_token_id, config.image_token_id, config.image_end_token_id),
             2: (config.video_start_token_id, config.video_token_id, config.video_end_token_id)}
    grids = {1: [], 2: []}

    def place(row: Row, item: Image | Video) -> None:
        kind = 1 if isinstance(item, Image) else 2
        t, h, w = item_grid(item, patch, merge, 1)  # the tower sees every frame (no temporal patch)
        if kind == 2 and t % tmerge:
            raise ValueError(f"{item}: frames must be a positive multiple of temporal_merge_size={tmerge}")
        grids[kind].append((t, h, w))
        n = (t // tmerge if kind == 2 else t) * h * w // (merge * merge)
        start, token, end = marks[kind]
        row.add([start] + [token] * n + [end], [0] + [kind] * n + [0])

    rows = batch.rows(place, avoid={i for m in marks.values() for i in m})
    out = batch.packed(rows)
    # (an item's markers are of its kind here too; a text id is never a marker or a placeholder)
    moe_kind = {i: kind for kind, ids in marks.items() for i in ids}
    out["moe_mm_token_type_ids"] = pack_rows([r.ids for r in rows], [[moe_kind.get(i, 0) for i in r.ids] for r in rows],
                                             batch.pad, batch.padding_side)["mm_token_type_ids"]
    out.update(pixel_inputs(vc, grids[1], grids[2], batch.gen))
    return out


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_ernie_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"ernie4_5_vl_moe": "ERNIE-4.5-VL"})
