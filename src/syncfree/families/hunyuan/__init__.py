"""HunYuan-VL (HunyuanOCR), and HY-V4-VL which reuses its tower, placeholder layout and host rotary index.

HunYuan-VL: a SigLIP-style packed tower with a learned position table resampled per image and a
convolution merger, before HunYuan's dense text model with its own multimodal rotary index. Images only.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* the tower (``HunYuanVLVisionTransformer.forward(pixel_values, grid_thw)``) has no rotary ids: the wrapper hands it
  only the segment sizes (``make_vision_forward_seqlens_only``); its per-image ``F.interpolate`` of the position table
  and its merger loop read the grid, which is the plan's host grid there (no sync, stock's kernels kept); in a forward
  traced with inputs from ``prepare`` (``Layout.stream``) each loop is one operator over the plan's host grid, the
  merger's parameters among its arguments (``stream``), and ``get_image_features``' split one piece
  (``planned_feature_sizes``): one graph for a stream of layouts;
* each segment's attention call passes only the scale (``VISION_ATTENTION_SCALING``);
* the merger appends a newline column to every merged row and a begin and an end embedding to every image: an image
  is ``lh * (lw + 1) + 2`` placeholders (``TowerShape.row_extra_tokens`` / ``item_extra_tokens``), between the
  ``im_start`` and ``im_end`` ids;
* the placeholder check selects the placeholders with the expanded mask (``PLACEHOLDER_NUMEL``: the plan's count);
* its rotary index (``len(mrope_section)`` axes; (width, height, image ordinal) on the last three over each image's
  grid) is its own: the plan computes it in NumPy per run of tokens (``rope.hunyuan_rope_index``, checked against
  stock's), or runs stock's index on the host where that does not model the layout (``RotaryIndex.host_class``), and
  the forward takes them from the plan (``make_host_rope_index``).

HY-V4-VL (``hy_v4_vl``): the same tower forward and attention (AST-identical), a merger that keeps the newline column
but adds no begin/end embeddings, and no markers around an image or a video (the config names none): an image is
``lh * (lw + 1)`` image placeholders, a video ``t * lh * (lw + 1)`` video placeholders (typed 2), one run per video.
Its rotary index (Qwen3-VL's, minus the per-frame split, each frame a block of ``max(lh, lw + 1)`` positions and the
next item after the last block: ``vision_position_ids.max().item() + 1``) is its own too: in NumPy on the host
(``rope.hyv4_rope_index``), or stock's there, from the plan. Its text model (MLA with an indexer, MoE,
hyper-connections) needs no edit: in fp32 the MoE's
``_grouped_mm`` keeps its documented remainder (2 syncs), in bf16 none.
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Text, Video, batch_builder, item_grid, pixel_inputs
from ...plan.errors import InputsNotTaken
from ...plan.hooks import PlanHooks
from ...plan.spec import Layout, RotaryIndex, TowerShape
from ...rewrite.edits import PLACEHOLDER_MASK
from ...rewrite.edits_variants import PLACEHOLDER_NUMEL, VISION_ATTENTION_SCALING
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_host_rope_index, make_vision_forward_seqlens_only
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import family_module, scale_sections, vlm_targets
from . import features, stream
from .rope import hunyuan_rope_index, hyv4_rope_index

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "build_hunyuan_inputs", "build_hyv4_inputs"]

_MODEL = "HunYuanVLModel"
_HELPERS = {name: getattr(module, name) for module in (features, stream) for name in module.__all__}
_HYV4 = "HYV4VLModel"
# Both towers' merger splits the blocks' output by patches per item and loops over the grid's rows: the plan's host
# grid there in eager (no sync), the plan's rows in a traced forward (which cannot read the grid's values), and in a
# traced forward of a stream one operator over the plan's host grid, the split one piece (``stream``).
_TOWER_EDITS = (
    Edit("expr", "grid_thw.prod(dim=-1).tolist()", "_syncfree.item_patches(grid_thw, hidden_states)"),
    Edit("stmt", """
         for grid, item in zip(grid_thw.tolist(), split_items):
             _, h, w = grid
             processed_items.append(self.patch_merger(item, size=(h, w)))""", """
         if _syncfree.in_one_op(grid_thw):
             processed_items.append(_syncfree.merged_items(self.patch_merger, hidden_states, grid_thw))
         else:
             for grid, item in zip(_syncfree.listed_rows(grid_thw), split_items):
                 _, h, w = grid
                 processed_items.append(self.patch_merger(item, size=(h, w)))"""),
)
_TOWER_NEEDS = ("zip(grid_thw.tolist(), split_items)",)
# Both position resamplings loop ``for t, h, w in grid_thw:``: the host grid's rows in eager, the plan's rows as ints
# in a traced forward, where stock's 0-d rows would size the resampling by values the graph cannot read; in a traced
# forward of a stream one operator over the plan's host grid (``stream``).
_POSITION_ROWS = (Edit("stmt", """
    for t, h, w in grid_thw:
        position_embeddings_list.append(self.interpolate_pos_encoding(embeddings, h, w).squeeze(0).repeat(t, 1))""", """
    if _syncfree.in_one_op(grid_thw):
        position_embeddings_list.append(_syncfree.resampled_positions(self, embeddings, grid_thw))
    else:
        for t, h, w in _syncfree.grid_rows(grid_thw):
            position_embeddings_list.append(self.interpolate_pos_encoding(embeddings, h, w).squeeze(0).repeat(t, 1))""",
                        count=None),
                   # (Transformers 5.17 writes the loop's body otherwise: its rows are the plan's there, as above, and a
                   # stream's positions are resampled in the loop, a graph per layout. The loop itself is checked below.)
                   Edit("expr", "grid_thw", "_syncfree.grid_rows(grid_thw)", count=None))


def _position_rows(embed: str) -> tuple[Target, ...]:
    return (Target(embed, "forward", edits=_POSITION_ROWS),
            Target(embed, "forward", check_only=True, needs=("for t, h, w in grid_thw:",)))


def _hunyuan() -> Family:
    targets = vlm_targets(
        "HunYuanVLVisionAttention", "HunYuanVLVisionTransformer", _MODEL, "HunYuanVLForConditionalGeneration",
        image_only=True, attention_edits=VISION_ATTENTION_SCALING, vision_wrap=make_vision_forward_seqlens_only,
        vision_params=("pixel_values", "grid_thw"),
        base_vision_needs=("get_vision_attention_seqlens(grid_thw, self.config, kwargs=kwargs)", "**kwargs,"),
        vision_edits=_TOWER_EDITS, vision_needs=_TOWER_NEEDS,
        # (Each image's features: its merged rows with a newline column, a begin and an end embedding.)
        feature_split=(Edit("expr", "(merged_h * (merged_w + 1) + 2).tolist()",
                            "_syncfree.planned_feature_sizes(merged_h * (merged_w + 1) + 2, image_grid_thw, "
                            "image_outputs.pooler_output)"),))
    own = {
        # The placeholder count, and the check that selects the placeholders to count them again.
        "get_placeholder_mask": Target(_MODEL, "get_placeholder_mask", edits=PLACEHOLDER_MASK[:1] + PLACEHOLDER_NUMEL[:1]),
        # Its own index (no video inputs), from the plan; generate()'s position setup calls it too.
        "get_rope_index": Target(_MODEL, "get_rope_index", wrap=make_host_rope_index,
                                 params=("input_ids", "mm_token_type_ids", "image_grid_thw", "attention_mask"),
                                 needs=("self.get_vision_position_ids(",)),
    }
    targets = tuple(own.get(t.attr, t) if t.cls == _MODEL else t for t in targets
                    if t.attr != "_prepare_position_ids_for_generation")  # (it has no vision-token check to answer)
    targets += _position_rows("HunYuanVLVisionPatchEmbed")
    return Family("hunyuan_vl", targets, Layout(
        family_module("hunyuan_vl"), rope=RotaryIndex(host_class=_MODEL),
        tower=TowerShape(row_extra_tokens=1, item_extra_tokens=2), one_graph=True, stream=True,
        plan=PlanHooks(feature_words=_hunyuan_vl_words, rope_index=hunyuan_rope_index)), helpers=_HELPERS)


def _hunyuan_vl_words(kind: str, tokens: int, features: int, spec) -> str:
    # Stock's words where image placeholders and features disagree (its get_placeholder_mask).
    return f"Image features and image tokens do not match: tokens: {tokens}, features {features}"


def _hyv4() -> Family:
    targets = vlm_targets(
        "HYV4VLVisionAttention", "HYV4VLVisionModel", _HYV4, "HYV4VLForConditionalGeneration",
        attention_edits=VISION_ATTENTION_SCALING, vision_wrap=make_vision_forward_seqlens_only,
        vision_params=("pixel_values", "grid_thw"),
        base_vision_needs=("get_vision_attention_seqlens(grid_thw, self.config, kwargs=kwargs)", "**kwargs,"),
        vision_edits=_TOWER_EDITS, vision_needs=_TOWER_NEEDS,
        # (Each item's features: its merged rows with a newline column, every frame; videos too, which it splits by
        # calling this with their grid.)
        feature_split=(Edit("expr", "split_sizes.tolist()",
                            "_syncfree.planned_feature_sizes(split_sizes, image_grid_thw, "
                            "vision_outputs.pooler_output)"),))
    # Its own index, from the plan (stock's on the host: the same numbers); generate()'s position setup calls it too
    # (its vision-token check is the shared GENERATION_POSITIONS edit). What makes it not Qwen-VL's: the frame blocks.
    rope = Target(_HYV4, "get_rope_index", wrap=make_host_rope_index,
                  params=("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw", "attention_mask"),
                  needs=("self.get_vision_position_ids(", "current_pos = vision_position_ids.max().item() + 1"))
    targets = tuple(rope if (t.cls, t.attr) == (_HYV4, "get_rope_index") else t for t in targets)
    # (The split's edit applies where its code is there; the eager path relies on it too: the plan's host grid.)
    targets += _position_rows("HYV4VLVisionPatchEmbed") + (
        Target(_HYV4, "get_image_features", check_only=True, needs=("split_sizes.tolist()",)),)
    return Family("hy_v4_vl", targets, Layout(
        family_module("hy_v4_vl"), rope=RotaryIndex(host_class=_HYV4), tower=TowerShape(row_extra_tokens=1),
        vision_markers=False, one_graph=True, stream=True,
        plan=PlanHooks(rope_index=hyv4_rope_index),
        packing_refused="its four rotary axes (text, width, height, image ordinal) are not the text row and 3D rows "
                        "a packed batch's positions are made of (a packed sample's logits differ by 1e-3)"),
        helpers=_HELPERS)


FAMILIES: tuple[Family, ...] = (_hunyuan(), _hyv4())

# A tiny model with the real layout rules: patch 16, merge 2, a learned 8x8 position table (max_image_size 128)
# resampled to every image, four rotary axes (text, width, height, image ordinal) as the published checkpoint has.
_HUNYUAN_TINY = dict(
    model_type="hunyuan_vl", image_token_id=1000, im_start_id=1001, im_end_id=1002, im_newline_id=1003,
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_channels=3, patch_size=16, spatial_merge_size=2, max_image_size=128,
                       interpolate_mode="bilinear"),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 2, 2, 2]),
                     pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
# HY-V4-VL: the same tower rules; a text model with every piece of the published one at small widths: MLA (low-rank
# queries and keys/values, a rope slice of 16 in three sections), an indexer choosing 8 keys per query (fewer than the
# tests' sequences, so its top-k selects), a full then a shared indexer, a dense then MoE layers (4 experts, 2 per
# token, a shared expert), hyper-connections of 2 streams.
_HYV4_TINY = dict(
    model_type="hy_v4_vl", image_token_id=1000, video_token_id=1001,
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, num_channels=3, patch_size=16, spatial_merge_size=2,
                       max_image_size=128, interpolate_mode="bilinear", out_hidden_size=64),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                     q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                     index_topk=8, index_head_dim=16, index_n_heads=2, hc_mult=2, max_position_embeddings=4096,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2]),
                     pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
PRESETS: dict[str, Preset] = {
    "hunyuan-vl-tiny": Preset("hunyuan-vl-tiny", _HUNYUAN_TINY, 0, "tiny HunYuan-VL for tests (four rotary axes)"),
    "hy-v4-vl-tiny": Preset("hy-v4-vl-tiny", _HYV4_TINY, 0,
                            "tiny HY-V4-VL for tests (MLA + indexer, MoE, hyper-connections)", text_attn="eager"),
}
VISION_CLASSES = {"hunyuan_vl": "HunYuanVLVisionTransformer", "hy_v4_vl": "HYV4VLVisionModel"}


def processor_batch(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                    pad_token_id: int | None = None) -> dict:
    build = build_hyv4_inputs if config.model_type == "hy_v4_vl" else build_hunyuan_inputs
    return build(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id)


def build_hunyuan_inputs(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                         pad_token_id: int | None = None) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``HunYuanVLProcessor`` lays them out: an image is ``im_start``, then ``lh * (lw + 1) + 2``
    image placeholders (its merged rows, each with a newline column, and the begin and end embeddings the merger
    adds), then ``im_end``; ``mm_token_type_ids`` marks the placeholders 1. Pixels are ``(patches, C * P * P)`` in
    raster order, as its image processor returns them."""
    if any(not isinstance(item, (Image, Text)) for sample in samples for item in sample):
        raise InputsNotTaken(f"{config.model_type} takes images and text only (its forward has no video inputs)")
    return _build(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id,
                  markers=(config.im_start_id, config.im_end_id), item_extra=2, specials={config.im_newline_id})


def build_hyv4_inputs(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                      pad_token_id: int | None = None) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``HYV4VLProcessor`` lays them out: an image is ``lh * (lw + 1)`` image placeholders typed 1
    (its merged rows, each with a newline column), a video one run of ``t * lh * (lw + 1)`` video placeholders typed
    2 (every frame's rows, frames one after another), nothing around them (the chat template writes any markers).
    Pixels are ``(patches, C * P * P)`` in raster order per frame, as its image and video processors return them."""
    return _build(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id, markers=None,
                  item_extra=0, specials=set())


@batch_builder()
def _build(batch: Draft, *, markers: tuple[int, int] | None, item_extra: int, specials: set) -> dict:
    config = batch.config
    vc = config.vision_config
    patch, merge = vc.patch_size, vc.spatial_merge_size
    image, video = config.image_token_id, getattr(config, "video_token_id", None)
    grids = ([], [])

    def place(row: Row, item: Image | Video) -> None:
        t, h, w = item_grid(item, patch, merge, 1)
        is_video = isinstance(item, Video)
        grids[is_video].append((t, h, w))
        tokens = t * (h // merge) * (w // merge + 1) + item_extra
        run, kind = [video if is_video else image] * tokens, [2 if is_video else 1] * tokens
        if markers:
            run, kind = [markers[0]] + run + [markers[1]], [0] + kind + [0]
        row.add(run, kind)

    out = batch.packed(batch.rows(place, avoid={image, video, *specials, *(markers or ())}))
    out.update(pixel_inputs(vc, *grids, batch.gen))
    return out


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_hunyuan_vl(config) -> None:
    # Its multimodal positions need M-RoPE axes (text, width, height, image index), which the checkpoint's config
    # sets and the default does not: four equal sections of the rotary half.
    text = config.text_config
    rope = dict(text.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    rope["mrope_section"] = scale_sections([1, 1, 1, 1], text.head_dim // 2)
    text.rope_parameters = rope


CENSUS_FIXES = {"hunyuan_vl": _census_fix_hunyuan_vl}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, processor_batch, presets=PRESETS, vision_classes=VISION_CLASSES,
                    census_fixes=CENSUS_FIXES, display={"hunyuan_vl": "HunYuan-VL", "hy_v4_vl": "HY-V4-VL"})
