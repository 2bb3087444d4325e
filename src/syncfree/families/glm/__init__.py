"""GLM-4.1V, GLM-4.5V (MoE), GLM-4.6V and GLM-OCR: Qwen2-VL's packed tower with learned positions resampled by
``grid_sample``, Qwen3-VL's rotary index (one run per frame), and video frames written with the image placeholder.

What is their own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* a video frame is ``<|begin_of_image|>`` + image placeholders + ``<|end_of_image|>`` + its timestamp, inside
  ``<|begin_of_video|>``..``<|end_of_video|>``; only ``mm_token_type_ids`` marks those placeholders 2, and stock
  counts image and video placeholders alike (a batch with both fails stock's check, and the plan's);
* ``get_video_features`` hands the tower one ``(1, h, w)`` grid row per frame (the plan has those rows too);
* the tower's embeddings index the grid with device tensors (``image_shapes[seq_ids, 1]``), so the patched tower
  is handed the plan's copy of the grid on the device, never the host one;
* GLM-4.6V has no tower of its own: it runs GLM-4.1V's classes;
* in a traced forward (``Layout.one_graph``), the per-frame grid ``get_video_features`` makes is sized by the plan's
  per-frame grid (``repeat_interleave`` with its ``output_size``: a symbol in a stream's graph, so a stream of videos
  of any frame count is one graph) and known to the tower by identity (``video_frame_grid``, its own rewrite
  helpers).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...items import Draft, Image, Row, Video, batch_builder, frame_timestamps, item_grid, pixel_inputs
from ...plan import active
from ...plan.errors import InputsNotTaken
from ...plan.spec import Layout, TowerShape, VideoLayout
from ...rewrite.edits import BLOCK_KWARGS, FEATURE_SPLIT
from ...rewrite.helpers import traced_vision_plan
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family
from ...rewrite.wrappers import make_vision_forward_device_grid
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import PACKS, family_module, vlm_targets

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP", "build_glm_inputs",
           "glm_stamp_tokens", "FRAME_GRID", "FRAME_GRID_HELPERS"]

# The tower's code the wrapper relies on: it passes its grid to the embeddings, which index it on the device.
_TOWER_NEEDS = ("self.embeddings(", "grid_thw,")
_ROPE_NEEDS = ("video_grid_thw[:, 0] = 1",)

# get_video_features: stock's per-frame grid, made by a repeat_interleave whose size a traced forward cannot read.
FRAME_GRID = (
    Edit("stmt", "flattened_hw = torch.repeat_interleave(hw, t, dim=0)",
         "flattened_hw = _syncfree.video_frame_rows(video_grid_thw, hw, t)"),
    Edit("stmt", "flattened_video_grid_thw = torch.cat([prefix_ones, flattened_hw], dim=1)",
         "flattened_video_grid_thw = _syncfree.video_frame_grid(video_grid_thw, "
         "torch.cat([prefix_ones, flattened_hw], dim=1))"),
)


def video_frame_rows(video_grid_thw, hw, t):
    """``torch.repeat_interleave(hw, t, dim=0)``: one (h, w) row per frame; sized by the plan's frames in a traced
    forward whose plan describes this grid (the same values; a size the graph cannot read from ``t``)."""
    entry, vp = active.current(), traced_vision_plan(video_grid_thw)
    frames = entry.plan.video_frames if vp is not None else None
    if frames is None:
        return torch.repeat_interleave(hw, t, dim=0)
    # (the frames' count as the size of the plan's per-frame grid, which a stream's graph holds as a symbol: not the
    # rows' Python count, which it would be specialised on)
    return torch.repeat_interleave(hw, t, dim=0, output_size=frames.grid_thw.shape[0])


def video_frame_grid(video_grid_thw, frame_grid):
    """``frame_grid`` (the per-frame grid stock made from ``video_grid_thw``), made known to the traced forward's
    tower wrapper as the grid of the plan's frames (by identity, as the call's own grids are: ``Entry.note``)."""
    entry, vp = active.current(), traced_vision_plan(video_grid_thw)
    frames = entry.plan.video_frames if vp is not None else None
    if frames is not None:
        entry.note(frame_grid, frames, frames.rows)
    return frame_grid


# The helpers FRAME_GRID calls (a family whose get_video_features is GLM-4.6V's takes both).
FRAME_GRID_HELPERS = {"video_frame_rows": video_frame_rows, "video_frame_grid": video_frame_grid}


def _glm(model_type: str, prefix: str, tower_prefix: str | None = None, tower_module: str | None = None,
         ocr: bool = False, packs: bool = False) -> Family:
    tower = tower_prefix or prefix
    # GLM-OCR's tower has no learned positions (its grid is read by nothing but the helpers, so the host grid
    # serves) and calls its blocks without **kwargs (BLOCK_KWARGS passes syncfree's own keys on).
    tower_options = (dict(vision_edits=BLOCK_KWARGS) if ocr
                     else dict(vision_needs=_TOWER_NEEDS, vision_wrap=make_vision_forward_device_grid))
    targets = vlm_targets(f"{tower}VisionAttention", f"{tower}VisionModel", f"{prefix}Model",
                          f"{prefix}ForConditionalGeneration", rope_needs=_ROPE_NEEDS, vision_module=tower_module,
                          feature_split=FEATURE_SPLIT + FRAME_GRID, **tower_options)
    return Family(model_type, targets, Layout(family_module(model_type),
                                              video=VideoLayout(frames_as_runs=True, frames_as_images=True),
                                              tower=TowerShape(modeling=tower_module),
                                              one_graph=True, stream=True, **PACKS if packs else {}),
                  helpers=FRAME_GRID_HELPERS)


FAMILIES: tuple[Family, ...] = (
    _glm("glm4v", "Glm4v", packs=True),
    _glm("glm4v_moe", "Glm4vMoe", packs=True),
    _glm("glm46v", "Glm46V", tower_prefix="Glm4v", tower_module=family_module("glm4v"), packs=True),
    _glm("glm_ocr", "GlmOcr", ocr=True, packs=True),
)

# Tiny models with the real layout rules: patch 14, temporal patch 2, merge 2, a learned 8x8 position table
# (image_size 112) resampled to every grid, M-RoPE over half of each text head (as the published 0.5).
_TINY_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, in_channels=3,
                    image_size=112, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, hidden_act="silu")
_TINY_ROPE = dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1], partial_rotary_factor=0.5)
_TINY_TEXT = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_parameters=_TINY_ROPE,
                  bos_token_id=None, eos_token_id=None)
_TINY_IDS = dict(image_token_id=1000, video_token_id=1001, image_start_token_id=1002, image_end_token_id=1003,
                 video_start_token_id=1004, video_end_token_id=1005)
_GLM4V_TINY = dict(model_type="glm4v", **_TINY_IDS, vision_config=_TINY_VISION, text_config=_TINY_TEXT)
_GLM4V_MOE_TINY = dict(model_type="glm4v_moe", **_TINY_IDS, vision_config=_TINY_VISION,
                       text_config=dict(_TINY_TEXT, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                        moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
                                        head_dim=16))
_GLM_OCR_TINY = dict(model_type="glm_ocr", **_TINY_IDS, vision_config=dict(_TINY_VISION, attention_bias=True),
                     text_config=_TINY_TEXT)
_GLM46V_TINY = dict(model_type="glm46v", **_TINY_IDS, vision_config=dict(_TINY_VISION, model_type="glm4v_vision"),
                    text_config=dict(_TINY_TEXT, model_type="glm4v_text"))

# Published shapes (config.json values as published; random weights). GLM-4.1V-9B-Thinking and GLM-4.5V share the
# tower (24 blocks of 1536, a 24x24 learned table from image_size 336); GLM-4.5V's merger is 10944 wide.
_GLM_IDS = dict(image_start_token_id=151339, image_end_token_id=151340, video_start_token_id=151341,
                video_end_token_id=151342)
_GLM_VISION = dict(depth=24, hidden_size=1536, num_heads=12, attention_bias=False, hidden_act="silu", image_size=336,
                   patch_size=14, in_channels=3, out_hidden_size=4096, spatial_merge_size=2, temporal_patch_size=2,
                   rms_norm_eps=1e-5)
_GLM_ROPE = dict(rope_type="default", rope_theta=10000.0, mrope_section=[8, 12, 12], partial_rotary_factor=0.5)
_GLM41V_9B = dict(  # zai-org/GLM-4.1V-9B-Thinking
    model_type="glm4v", tie_word_embeddings=False, image_token_id=151343, video_token_id=151344, **_GLM_IDS,
    vision_config=dict(_GLM_VISION, intermediate_size=13696),
    text_config=dict(vocab_size=151552, hidden_size=4096, intermediate_size=13696, num_hidden_layers=40,
                     num_attention_heads=32, num_key_value_heads=2, attention_bias=True, hidden_act="silu",
                     rms_norm_eps=1e-5, max_position_embeddings=65536, rope_parameters=dict(_GLM_ROPE)),
)
_GLM45V = dict(  # zai-org/GLM-4.5V (106B, 12B active)
    model_type="glm4v_moe", tie_word_embeddings=False, image_token_id=151363, video_token_id=151364, **_GLM_IDS,
    vision_config=dict(_GLM_VISION, intermediate_size=10944),
    text_config=dict(vocab_size=151552, hidden_size=4096, intermediate_size=10944, num_hidden_layers=46,
                     num_attention_heads=96, num_key_value_heads=8, head_dim=128, attention_bias=True,
                     use_qk_norm=False, hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=65536,
                     rope_parameters=dict(_GLM_ROPE), n_routed_experts=128, num_experts_per_tok=8,
                     moe_intermediate_size=1408, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                     topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0),
)
_GLM_OCR = dict(  # zai-org/GLM-OCR
    model_type="glm_ocr", tie_word_embeddings=False, image_token_id=59280, video_token_id=59281,
    image_start_token_id=59256, image_end_token_id=59257, video_start_token_id=59258, video_end_token_id=59259,
    vision_config=dict(depth=24, hidden_size=1024, num_heads=16, attention_bias=True, intermediate_size=4096,
                       hidden_act="silu", image_size=336, patch_size=14, in_channels=3, out_hidden_size=1536,
                       rms_norm_eps=1e-5, spatial_merge_size=2, temporal_patch_size=2),
    text_config=dict(vocab_size=59392, hidden_size=1536, intermediate_size=4608, num_hidden_layers=16,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, attention_bias=False,
                     hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=131072,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[16, 24, 24],
                                          partial_rotary_factor=1.0)),
)

PRESETS: dict[str, Preset] = {
    "glm4.1v-9b": Preset("glm4.1v-9b", _GLM41V_9B, 151329, "GLM-4.1V-9B-Thinking (published shapes)"),
    "glm4.5v": Preset("glm4.5v", _GLM45V, 151329, "GLM-4.5V, 106B MoE (published shapes)"),
    "glm-ocr": Preset("glm-ocr", _GLM_OCR, 59246, "GLM-OCR (published shapes)"),
    "glm4.1v-tiny": Preset("glm4.1v-tiny", _GLM4V_TINY, 0, "tiny GLM-4.1V for tests (learned positions)"),
    "glm4.5v-tiny": Preset("glm4.5v-tiny", _GLM4V_MOE_TINY, 0, "tiny GLM-4.5V for tests (MoE text model)"),
    "glm4.6v-tiny": Preset("glm4.6v-tiny", _GLM46V_TINY, 0, "tiny GLM-4.6V for tests (GLM-4.1V's tower)"),
    "glm-ocr-tiny": Preset("glm-ocr-tiny", _GLM_OCR_TINY, 0, "tiny GLM-OCR for tests"),
}
VISION_CLASSES = {"glm4v": "Glm4vVisionModel", "glm4v_moe": "Glm4vMoeVisionModel", "glm46v": "Glm4vVisionModel",
                  "glm_ocr": "GlmOcrVisionModel"}


def processor_batch(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                    pad_token_id: int | None = None) -> dict:
    kinds = {type(item) for sample in samples for item in sample}
    if Image in kinds and Video in kinds:
        raise InputsNotTaken(f"{config.model_type} cannot take images and videos in one batch: its video frames use the "
                         "image placeholder and stock Transformers refuses the mix; choose images or videos")
    return build_glm_inputs(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id)


def glm_stamp_tokens(video: Video, t: int, temporal_patch: int) -> list[int]:
    """The text tokens of each temporal patch's timestamp, as the GLM-4.1V/4.6V processors write it: ``int(seconds)``
    (a stand-in tokenizer: a token per digit)."""
    return [len(str(int(stamp))) for stamp in frame_timestamps(video.frames, video.fps, temporal_patch)]


@batch_builder()
def build_glm_inputs(batch: Draft, *,
                     stamp_tokens: Callable[[Video, int, int], list[int]] = glm_stamp_tokens) -> dict[str, torch.Tensor]:
    """Inputs laid out as the GLM-4.1V/4.6V processors lay them out: an image is begin-of-image, its
    placeholders, end-of-image; a video is begin-of-video, then per temporal patch begin-of-image, that frame's
    image placeholders, end-of-image and its timestamp in text (``stamp_tokens(video, t, temporal_patch)`` tokens:
    a family that writes its timestamps otherwise passes its own), then end-of-video. ``mm_token_type_ids`` marks
    image placeholders 1, and 2 inside a video."""
    config = batch.config
    vc = config.vision_config
    patch, merge, tpatch = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
    image, begin, end = config.image_token_id, config.image_start_token_id, config.image_end_token_id
    image_grids, video_grids = [], []

    def place(row: Row, item: Image | Video) -> None:
        t, h, w = item_grid(item, patch, merge, tpatch)
        per_frame = h * w // (merge * merge)
        if isinstance(item, Image):
            image_grids.append((t, h, w))
            row.add([begin] + [image] * per_frame + [end], [0] + [1] * per_frame + [0])
            return
        video_grids.append((t, h, w))
        row.add([config.video_start_token_id])
        for n_stamp in stamp_tokens(item, t, tpatch):
            row.add([begin] + [image] * per_frame + [end], [0] + [2] * per_frame + [0])
            row.text(n_stamp)
        row.add([config.video_end_token_id])

    specials = {image, config.video_token_id, begin, end, config.video_start_token_id, config.video_end_token_id}
    out = batch.packed(batch.rows(place, avoid=specials))
    out.update(pixel_inputs(vc, image_grids, video_grids, batch.gen))
    return out


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, processor_batch, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"glm4v": "GLM-4.1V", "glm4v_moe": "GLM-4.5V", "glm46v": "GLM-4.6V", "glm_ocr": "GLM-OCR"})
