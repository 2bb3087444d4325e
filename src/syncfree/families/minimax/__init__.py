"""MiniMax-M3-VL: a CLIP-like packed tower with 3D (t, h, w) rotary ids, a projector that merges patches after it, and
MiniMax-M3's MoE text model (block-sparse indexer layers) without 3D positions.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* no rotary index: the text model numbers tokens itself and the processor returns no ``mm_token_type_ids`` (the
  EXAONE-4.5 layout: the plan computes no positions, counts placeholders);
* the tower attends over each image or video chunk as one segment (``merge_temporal=True``) and rotates the frame
  axis too (``include_temporal=True``: (t, row, col) ids): the plan's ``clip_segments`` / ``temporal_position_ids``;
* the tower is ``vision_tower``, takes ``pixel_values``; its attention loop collects each segment's weights
  (``VISION_ATTENTION_WEIGHTS``);
* get_placeholder_mask checks the count by a boolean select (``inputs_embeds[mask].numel()``): ``PLACEHOLDER_NUMEL``;
* the projector sits outside the tower (``vision_every_step`` is refused);
* the processor writes each image as its start marker, its placeholders and its end marker, and each video as, per
  temporal patch, the timestamp of its first frame in text, then start, that frame's placeholders, end; its video
  processor cuts each video into chunks of at most ``vision_segment_max_frames`` (4) temporal patches, one grid row
  (and one attention segment) each, and returns ``num_chunks_per_video``.
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Video, batch_builder, item_grid, pixel_inputs
from ...plan.spec import Layout, RotaryIndex, TowerShape
from ...rewrite.edits import VISION_ATTENTION_WEIGHTS, feature_split
from ...rewrite.edits_variants import PLACEHOLDER_NUMEL
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import family_module, installed_source_has, vlm_targets

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "build_minimax_inputs", "CHUNK_FRAMES"]

_MODELING = family_module("minimax_m3_vl")
_TARGETS = vlm_targets(
    "MiniMaxM3VLVisionAttention", "MiniMaxM3VLVisionModel", "MiniMaxM3VLModel", "MiniMaxM3SparseForConditionalGeneration",
    rope_needs=None, attention_edits=VISION_ATTENTION_WEIGHTS, vision_params=("pixel_values", "grid_thw"),
    placeholder_edits=PLACEHOLDER_NUMEL,
    feature_split=feature_split("self.multi_modal_projector.spatial_merge_size", kinds=("image",)),
    vision_needs=("merge_temporal=self.merge_temporal", "include_temporal=self.include_temporal"))
# The plan's segments and ids stand for the tower's two flags as its __init__ sets them (a release that changes them
# is refused, not planned wrongly).
_TARGETS += (Target("MiniMaxM3VLVisionModel", "__init__", check_only=True,
                    needs=("self.merge_temporal = True", "self.include_temporal = True")),)
# The indexer's block padding and its top-k of blocks, sized by the keys: Python branches on the key count that a traced
# forward would guard on (a graph for lengths that fill their last block and one for lengths that do not; one for fewer
# blocks than the top k), asked without a guard there (``pad_keys``, the shared ``size_min``); and the top-k's width,
# which a traced forward keeps at ``topk_blocks`` (``top_blocks``: a width of ``min(topk, blocks)`` guards on being 1
# in every broadcast that follows it, stock's own ``masked_fill`` first).
_TARGETS += (Target("MiniMaxM3VLIndexer", "forward", edits=(
    Edit("stmt", """
         if pad:
             scores = F.pad(scores, (0, pad), value=float("-inf"))""", """
         if _syncfree.pad_keys(pad):
             scores = F.pad(scores, (0, pad), value=float("-inf"))"""),
    Edit("expr", "min(self.topk_blocks, num_key_blocks)", "_syncfree.size_min(self.topk_blocks, num_key_blocks)"),
    Edit("expr", "block_scores.topk(topk, dim=-1)", "_syncfree.top_blocks(block_scores, topk, self.topk_blocks)"),
)), Target("MiniMaxM3VLIndexer", "build_block_mask", edits=(
    Edit("expr", "(bias == 0.0).repeat_interleave(self.block_size, dim=-1)[..., :key_length]",
         "_syncfree.keys_of_blocks(bias, self.block_size, key_length)"),
)),)


def pad_keys(pad) -> bool:
    """``if pad:``: in a traced forward always (a pad by 0 keeps the same values), so the graph serves every length."""
    return True if torch.compiler.is_compiling() else bool(pad)


def top_blocks(block_scores: torch.Tensor, topk, topk_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_scores.topk(topk, dim=-1)``; in a traced forward, the top ``topk_blocks`` of the scores padded with
    ``-inf`` blocks up to that many, so the width is the config's constant and no broadcast after it guards on its
    being 1 (a text of one block). Where there are fewer blocks than that, the extra slots score ``-inf``, which stock
    tags ``-1`` like its own empty slots, and ``build_block_mask`` drops ``-1`` slots: the same mask. (Slots are in the
    order top-k gives them in either case; only equal scores may come in another order, and the mask is a set.)"""
    if not torch.compiler.is_compiling():
        return block_scores.topk(topk, dim=-1)
    missing = torch.sym_max(topk_blocks - block_scores.shape[-1], 0)
    return torch.nn.functional.pad(block_scores, (0, missing), value=float("-inf")).topk(topk_blocks, dim=-1)


def keys_of_blocks(bias: torch.Tensor, block_size: int, keys) -> torch.Tensor:
    """``(bias == 0.0).repeat_interleave(block_size, dim=-1)[..., :keys]``: each block's verdict on each of its keys.
    In a traced forward, each key's block's bias compared (the same values): stock compares a tensor one column per
    block wide, which guards on a text's being one block long (Dynamo's check of a broadcast against a size of 1), and
    its slice makes a view whose strides guard on it again in the ``repeat_interleave`` after it."""
    if not torch.compiler.is_compiling():
        return (bias == 0.0).repeat_interleave(block_size, dim=-1)[..., :keys]
    return bias.index_select(-1, torch.arange(keys, device=bias.device) // block_size) == 0.0


def _written_for() -> bool:
    """Whether the installed MiniMax-M3-VL is the code this family was written for (Transformers 5.24's packed tower).
    Older releases (5.17) have a tower without segments or these helpers: the family is not registered there, so
    ``syncfree.patch()`` of every installed family's classes does not refuse (read from the file: nothing imported)."""
    return installed_source_has(_MODELING, "get_vision_attention_seqlens(")


FAMILIES: tuple[Family, ...] = () if not _written_for() else (
    Family("minimax_m3_vl", _TARGETS,
           Layout(_MODELING, rope=RotaryIndex(mrope=False), vision_markers=False, token_types=False,
                  tower=TowerShape(holds_projector=False, clip_segments=True, temporal_position_ids=True),
                  one_graph=True, stream=True),
           helpers={"pad_keys": pad_keys, "top_blocks": top_blocks,
                    "keys_of_blocks": keys_of_blocks}),
)

# A tiny model with the real layout rules: patch 14, temporal patch 2, merge 2 (in the projector), a vision head of 12
# (4 rotated channels per axis), a dense and a MoE layer (4 experts, top 2, a shared expert), full attention and the
# block-sparse indexer layer (blocks of 8 keys, 2 kept), partial text rope.
_MINIMAX_TINY = dict(
    model_type="minimax_m3_vl", image_token_index=1000, video_token_index=1001, projector_hidden_size=64,
    vision_config=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_channels=3, image_size=224, patch_size=14, temporal_patch_size=2, spatial_merge_size=2),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=64, dense_intermediate_size=128,
                     shared_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, rotary_dim=8, max_position_embeddings=4096, num_local_experts=4,
                     num_experts_per_tok=2, mlp_layer_types=["dense", "sparse"],
                     layer_types=["full_attention", "minimax_m3_sparse"],
                     rope_parameters=dict(rope_type="default", rope_theta=5000000.0, partial_rotary_factor=0.5),
                     index_n_heads=2, index_head_dim=16, index_block_size=8, index_topk_blocks=2,
                     index_local_blocks=1, pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
PRESETS: dict[str, Preset] = {
    "minimax-m3-vl-tiny": Preset("minimax-m3-vl-tiny", _MINIMAX_TINY, 0,
                                 "tiny MiniMax-M3-VL for tests (3D tower rope, MoE and indexer layers)"),
} if FAMILIES else {}
VISION_CLASSES = {"minimax_m3_vl": "MiniMaxM3VLVisionModel"} if FAMILIES else {}

CHUNK_FRAMES = 4  # the video processor's vision_segment_max_frames: temporal patches per grid row


def markers(config) -> tuple[int, int]:
    """Stand-ins for the tokenizer's ids of ``]<]start of image[>[`` and ``]<]end of image[>[`` (the config names
    none): two text ids after the placeholders'."""
    top = max(config.image_token_id, config.video_token_id)
    return top + 1, top + 2


@batch_builder()
def build_minimax_inputs(batch: Draft) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``MiniMaxM3VLProcessor`` lays them out (processing_minimax_m3_vl.py): an image is start,
    one placeholder per merged patch, end; a video is, per temporal patch, ``]<]{seconds:.1f} seconds[>[`` in text
    (the time of the patch's first frame), start, that frame's placeholders, end. Video grids are cut into rows of at
    most ``CHUNK_FRAMES`` temporal patches, with ``num_chunks_per_video``, as the video processor returns them. No
    ``mm_token_type_ids``."""
    config = batch.config
    vc = config.vision_config
    patch, merge, tpatch = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
    start, end = markers(config)
    image_grids, video_grids, chunks = [], [], []

    def place(row: Row, item: Image | Video) -> None:
        t, h, w = item_grid(item, patch, merge, tpatch)
        per_frame = h * w // (merge * merge)
        if isinstance(item, Image):
            image_grids.append((t, h, w))
            row.add([start] + [config.image_token_id] * per_frame + [end])
            return
        rows_of_video = [(min(CHUNK_FRAMES, t - s), h, w) for s in range(0, t, CHUNK_FRAMES)]
        video_grids.extend(rows_of_video)
        chunks.append(len(rows_of_video))
        for frame in range(t):
            row.text(len(f"]<]{frame * tpatch / item.fps:.1f} seconds[>[") // 3)
            row.add([start] + [config.video_token_id] * per_frame + [end])

    specials = {config.image_token_id, config.video_token_id, start, end}
    out = batch.packed(batch.rows(place, avoid=specials), typed=False)
    out.update(pixel_inputs(vc, image_grids, video_grids, batch.gen))
    if chunks:
        out["num_chunks_per_video"] = torch.tensor(chunks, dtype=torch.long)
    return out


__all__ += ["Image", "Video", "Text"]  # (the items build_minimax_inputs takes)


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_minimax_m3_vl(config) -> None:
    # The projector's merge MLP takes merge**2 projected patches side by side: derived from the text width.
    config.merged_hidden_size = config.text_config.hidden_size * config.vision_config.spatial_merge_size**2


CENSUS_FIXES = {"minimax_m3_vl": _census_fix_minimax_m3_vl}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_minimax_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    census_fixes=CENSUS_FIXES, display={"minimax_m3_vl": "MiniMax-M3-VL"})
