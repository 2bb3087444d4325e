"""Kimi-K2.5: MoonViT (a packed tower with 2D axial rotary ids, a bicubically resampled learned position table and a
frame embedding, pooling each clip's frames after its encoder) and DeepSeek-V3's MoE text model, without 3D positions.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* no rotary index: the text model numbers tokens itself and the processor returns no ``mm_token_type_ids`` (the
  EXAONE-4.5 layout: the plan computes no positions, counts placeholders);
* the tower's helpers take merge 1 (raster order: ``tower_merge=1``), resample its learned ``pos_emb_height`` table
  bicubically without aligned corners (``interp_mode``, ``table_side_attr``, read ``interpolation_align_corners``),
  attend over each image or chunk of frames as one segment (``clip_segments``), add a frame embedding per patch and
  average each clip's frames onto one frame's merged tokens (``temporal_pooling``: the plan hands stock's
  ``frame_index`` and ``temporal_merge_index``, and a grid row yields h*w/4 features whatever its t);
* the tower is ``vision_tower``, takes ``pixel_values`` as (patches, 3, 14, 14); the projector sits outside it;
* the processor writes each image as its placeholders only (the chat template writes the markers) and cuts each video
  into chunks of ``temporal_patch_size`` (4) frames, one grid row each, written
  ``HH:MM:SS.mmm<|media_begin|>video<|media_content|>{h*w/4 placeholders}<|media_end|>``.
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Video, batch_builder, item_grid, pixel_inputs
from ...plan.spec import Layout, PositionTable, RotaryIndex, TowerShape
from ...rewrite.helpers import traced_vision_plan
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import family_module, installed_source_has, vlm_targets

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "build_kimi_inputs", "CHUNK_FRAMES"]

_MODELING = family_module("kimi_k25")
# The tower's stock forward, as the wrapper relies on it (its seqlens call is split over lines, so the shared
# ``VISION_NEEDS`` spelling is not used): the helpers pop the plan's values from its kwargs.
_VISION_NEEDS = ("get_vision_position_ids(grid_thw, spatial_merge_size=1, kwargs=kwargs)", "merge_temporal=True",
                 "kwargs=kwargs", "**kwargs,", "self.temporal_merge(hidden_states, grid_thw")
_TARGETS = vlm_targets(
    "Kimi_K25VisionAttention", "Kimi_K25VisionModel", "Kimi_K25Model", "Kimi_K25ForConditionalGeneration",
    rope_needs=None, vision_params=("pixel_values", "grid_thw"), base_vision_needs=_VISION_NEEDS,
    # (its videos' features are its images': get_video_features calls get_image_features)
    feature_split=(Edit("expr", "(image_grid_thw[:, 1:].prod(-1) // merge_kernel_size).tolist()",
                        "_syncfree.spatial_split_sizes(image_grid_thw, merge_kernel_size, image_embeds)"),))
# What the plan's tables stand for, as the installed source says it (a release that changes it is refused, not
# planned wrongly): the bicubic table of pos_emb_height a side, the frame index and the pooling popped from kwargs,
# and the split that ignores t.
_TARGETS += (
    Target("Kimi_K25VisionPositionEmbeddings", "__init__", check_only=True,
           needs=("self.num_grid_per_side = config.pos_emb_height", 'self.interpolation_mode = "bicubic"')),
    Target("Kimi_K25VisionPositionEmbeddings", "forward", check_only=True,
           needs=("mode=self.interpolation_mode", "get_vision_frame_index(grid_thw, kwargs=kwargs)")),
    Target("Kimi_K25VisionModel", "temporal_merge", check_only=True,
           needs=("get_vision_temporal_merge_index(", "kwargs=kwargs")),
    Target("Kimi_K25Model", "get_image_features", check_only=True,
           needs=("image_grid_thw[:, 1:].prod(-1) // merge_kernel_size",)),
)


def spatial_split_sizes(grid_thw, merge: int, features=None):
    """``(grid_thw[:, 1:].prod(-1) // merge).tolist()`` (features per image or clip, whatever its frames): its own
    rewrite helper (``Family.helpers``), from the plan's rows in a traced forward (which cannot read the grid); in a
    traced forward of a stream (``Layout.stream``) one piece, the whole ``features`` (the forward concatenates the
    pieces again; a split per item would be a graph per item count)."""
    vp = traced_vision_plan(grid_thw)
    if vp is None or not isinstance(merge, int):
        return (grid_thw[:, 1:].prod(-1) // merge).tolist()
    if features is not None and vp.host_seqlens is not None:
        return [features.shape[0]]
    return [h * w // merge for _, h, w in vp.rows]


def _written_for() -> bool:
    """Whether the installed Kimi-K2.5 is the code this family was written for (Transformers 5.24's: the frame index
    helper and the tower's ``temporal_merge`` by ``index_add_``). Transformers 5.17's tower pools frames by a gather
    of its own: the family is not registered there (its tower stays stock; read from the file: nothing imported)."""
    return installed_source_has(_MODELING, "def get_vision_frame_index(", "def temporal_merge(self")


FAMILIES: tuple[Family, ...] = () if not _written_for() else (
    Family("kimi_k25", _TARGETS,
           Layout(_MODELING, rope=RotaryIndex(mrope=False), vision_markers=False, token_types=False,
                  table=PositionTable(side="pos_emb_height", align_corners_from="Kimi_K25VisionPositionEmbeddings",
                                      mode="bicubic"),
                  tower=TowerShape(encoder_merge=1, pixels_4d=True, holds_projector=False, clip_segments=True,
                                   temporal_pooling=True),
                  one_graph=True, stream=True),
           helpers={"spatial_split_sizes": spatial_split_sizes}),
)

# A tiny model with the real layout rules: patch 14, merge kernel (2, 2), a 16x16 learned table, 4 frame embeddings,
# a vision head of 16; DeepSeek-V3's text model with multi-head latent attention, a MoE layer (4 experts, top 2, a
# shared expert) after a dense one.
_KIMI_TINY = dict(
    model_type="kimi_k25", image_token_id=1000, video_token_id=1001, vision_start_token_id=1002,
    vision_end_token_id=1003, projection_hidden_size=64, tie_word_embeddings=False,
    vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       patch_size=14, pos_emb_height=16, pos_emb_width=16, pos_emb_time=4, merge_kernel_size=[2, 2]),
    text_config=dict(model_type="deepseek_v3", vocab_size=1024, hidden_size=64, intermediate_size=128,
                     moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                     n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
                     n_group=1, topk_group=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
                     qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=4096, pad_token_id=0,
                     bos_token_id=None, eos_token_id=None, tie_word_embeddings=False),
)
PRESETS: dict[str, Preset] = {
    "kimi-k25-tiny": Preset("kimi-k25-tiny", _KIMI_TINY, 0,
                            "tiny Kimi-K2.5 for tests (bicubic table, frame pooling, MLA and MoE text layers)"),
} if FAMILIES else {}
VISION_CLASSES = {"kimi_k25": "Kimi_K25VisionModel"} if FAMILIES else {}

CHUNK_FRAMES = 4  # the video processor's temporal_patch_size: frames per grid row (chunk)


def markers(config) -> tuple[int, int, int, int]:
    """Stand-ins for the tokenizer's ids of ``<|media_begin|>``, ``video``, ``<|media_content|>`` and
    ``<|media_end|>`` (the config's vision start and end ids for the first and last, two text ids after them)."""
    top = max(config.image_token_id, config.video_token_id, config.vision_start_token_id, config.vision_end_token_id)
    return config.vision_start_token_id, top + 1, top + 2, config.vision_end_token_id


@batch_builder()
def build_kimi_inputs(batch: Draft) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``Kimi_K25Processor`` lays them out (processing_kimi_k25.py): an image is one placeholder
    per merged patch; a video (one frame per temporal unit: ``Video.frames``) is cut into chunks of ``CHUNK_FRAMES``
    frames, one grid row each, written as the chunk's first timestamp ``HH:MM:SS.mmm`` in text, then
    ``<|media_begin|>video<|media_content|>``, one frame's merged patches of placeholders, ``<|media_end|>``. Pixels
    are (patches, 3, patch, patch). No ``mm_token_type_ids``; ``num_chunks_per_video`` as the video processor
    returns it."""
    config = batch.config
    patch, merge = config.vision_config.patch_size, config.vision_config.merge_kernel_size[0]
    begin, word, content, end = markers(config)
    image_grids, video_grids, chunks = [], [], []

    def place(row: Row, item: Image | Video) -> None:
        t, h, w = item_grid(item, patch, merge, 1)  # (the video processor's frames: one per temporal unit)
        per_frame = h * w // (merge * merge)
        if isinstance(item, Image):
            image_grids.append((1, h, w))
            row.add([config.image_token_id] * per_frame)
            return
        starts = range(0, t, CHUNK_FRAMES)
        video_grids.extend((min(CHUNK_FRAMES, t - s), h, w) for s in starts)
        chunks.append(len(starts))
        for s in starts:
            seconds = s / item.fps
            stamp = f"{int(seconds) // 3600:02d}:{int(seconds) // 60 % 60:02d}:{int(seconds) % 60:02d}." \
                    f"{int(seconds % 1 * 1000):03d}"
            row.text(len(stamp) // 3)
            row.add([begin, word, content] + [config.video_token_id] * per_frame + [end])

    specials = {config.image_token_id, config.video_token_id, begin, word, content, end}
    out = batch.packed(batch.rows(place, avoid=specials), typed=False)
    out.update(pixel_inputs(_PixelConfig(patch), image_grids, video_grids, batch.gen, pixels_4d=True))
    if chunks:
        out["num_chunks_per_video"] = torch.tensor(chunks, dtype=torch.long)
    return out


class _PixelConfig:
    """What ``pixel_inputs`` reads of a vision config: MoonViT's Conv2d takes 3 channels, one frame per patch."""

    num_channels = 3
    temporal_patch_size = 1

    def __init__(self, patch_size: int):
        self.patch_size = patch_size


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_kimi_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"kimi_k25": "Kimi-K2.5"})
