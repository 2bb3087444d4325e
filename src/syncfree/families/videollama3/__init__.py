"""VideoLLaMA3: a SigLIP-style packed tower with 2D rotary ids, whose images and videos each come with their own
spatial merge size, a projector after the tower, and Qwen2's text model without 3D positions.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* merge sizes per item are forward inputs (``image_merge_sizes`` 1, ``video_merge_sizes`` 2 from its processors), not a
  config value (``TowerShape.item_merge_sizes``): the plan keeps host copies, splits each item by its own ``t*h*w //
  merge**2`` and makes the tower's rotary ids with each row's merge (``vision_tables``, ``item_merges``);
* the tower (``vision_model``) takes ``(pixel_values, grid_thw, merge_sizes)`` and un-shuffles each item in a loop
  (``pixel_unshuffle``: ``view`` / ``reshape`` / ``interpolate`` sized by ``h // merge_size``): stock's loop is kept
  and handed the plan's host grid and host merge sizes (``make_vision_forward_item_merges``), so it reads nothing;
  the multimodal forward hands ``get_image_features`` / ``get_video_features`` those host copies too, so their
  split sizes (``prod(dim=1) // merge_sizes**2``, ``.tolist()``) are host integers; in a traced forward of a stream
  the loop is one operator over the plan's host grid and merge sizes and the split one piece (``stream``), the kept
  video features as many as the video placeholders: one graph for any layout;
* video token compression: the forward keeps the video features ``video_compression_mask`` marks with a boolean
  select, a read of the count; by positions counted on the plan's host copy of the mask instead
  (``KEPT_VIDEO_FEATURES`` in ``edits``, its helper in ``compression``);
* the attention loop collects each segment's weights (``VISION_ATTENTION_WEIGHTS``); the projector sits outside the
  tower (``vision_every_step`` is refused);
* no rotary index (the text model numbers tokens itself) and no ``mm_token_type_ids`` (the EXAONE-4.5 layout);
* the processor writes an image as ``t*h*w`` placeholders (merge 1), a video frame as ``"Time {t:.1f}s:"`` and the
  placeholders of the tokens the compression keeps in that frame, frames joined by ``","``; no markers.
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Video, batch_builder, item_grid
from ...plan.hooks import PlanHooks
from ...plan.spec import Layout, RotaryIndex, TowerShape
from ...rewrite.edits import VISION_ATTENTION_WEIGHTS
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import family_module, vlm_targets
from . import compression, item_sizes, stream
from .edits import ITEM_SPLIT, KEPT_VIDEO_FEATURES, PIXEL_UNSHUFFLE
from .wrappers import make_vision_forward_item_merges

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "build_videollama3_inputs", "compression_mask"]

_P = "VideoLlama3"


# Its merge size per image and per video (the tower reads them per item) and the video features it keeps: host copies,
# so neither the tower's loop nor the selection of the kept features reads the device.
PLAN = PlanHooks(inputs=("image_merge_sizes", "video_merge_sizes", "video_compression_mask"),
                 per_item=(("image_merge_sizes", "image"), ("video_merge_sizes", "video")),
                 per_row=("video_compression_mask",))


def _videollama3() -> Family:
    targets = vlm_targets(f"{_P}VisionAttention", f"{_P}VisionModel", f"{_P}Model", f"{_P}ForConditionalGeneration",
                          rope_needs=None, attention_edits=VISION_ATTENTION_WEIGHTS,
                          vision_wrap=make_vision_forward_item_merges,
                          vision_params=("pixel_values", "grid_thw", "merge_sizes"),
                          vision_needs=("get_vision_position_ids(grid_thw, merge_sizes",
                                        "self.pixel_unshuffle(last_hidden_state, grid_thw, merge_sizes)"),
                          vision_edits=(Edit("expr", "self.pixel_unshuffle(last_hidden_state, grid_thw, merge_sizes)",
                                             "_syncfree.unshuffled(self.pixel_unshuffle, last_hidden_state, grid_thw, "
                                             "merge_sizes)"),),
                          model_params=("image_merge_sizes", "video_merge_sizes", "video_compression_mask"),
                          model_edits=KEPT_VIDEO_FEATURES)
    targets += (
        # Stock's per-item loop and split sizes: on the host grid and merge sizes the wrappers hand them (eager), on
        # the plan's integers in a traced forward (which cannot take values out of a tensor).
        Target(f"{_P}VisionModel", "pixel_unshuffle", edits=PIXEL_UNSHUFFLE),
        Target(f"{_P}Model", "get_image_features", edits=ITEM_SPLIT,
               needs=("image_grid_thw.prod(dim=1) // (image_merge_sizes**2)",)),
    )
    layout = Layout(family_module("video_llama_3"), rope=RotaryIndex(mrope=False), vision_markers=False,
                    token_types=False, tower=TowerShape(holds_projector=False, item_merge_sizes=True), one_graph=True,
                    stream=True, plan=PLAN)
    own = {name: getattr(module, name) for module in (compression, item_sizes, stream) for name in module.__all__}
    return Family("video_llama_3", targets, layout, helpers=own)


FAMILIES: tuple[Family, ...] = (_videollama3(),)

# A tiny model with the real layout rules: patch 16, images merged 1, videos 2 (the processors' values), a 2-layer
# tower with 2D rotary ids, a 2-layer Qwen2 text model. (``spatial_merge_size``: not a config value of this family;
# it tells syncfree's CLI the pixel unit of its inputs, patch x the video merge. The model never reads it.)
_VIDEOLLAMA3_TINY = dict(
    model_type="video_llama_3", image_token_id=1000, video_token_id=1001,
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_channels=3, patch_size=16, spatial_merge_size=2),
    text_config=dict(model_type="qwen2", vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=0,
                     bos_token_id=None, eos_token_id=None),
)
PRESETS: dict[str, Preset] = {
    "video-llama3-tiny": Preset("video-llama3-tiny", _VIDEOLLAMA3_TINY, 0,
                                "tiny VideoLLaMA3 for tests (merge sizes per item, video token compression)"),
}
VISION_CLASSES = {"video_llama_3": f"{_P}VisionModel"}

IMAGE_MERGE, VIDEO_MERGE = 1, 2  # the image and video processors' defaults


def compression_mask(pixels: torch.Tensor, grid: tuple[int, int, int], merge: int, threshold: float = 0.1,
                     min_tokens: int = 1) -> torch.Tensor:
    """The video processor's ``_get_compression_mask`` for one video (its code: the processor module needs
    torchvision): a token is kept where its patches differ from the previous frame's by more than ``threshold`` on
    average (x255), every token of the first frame, and at least ``min_tokens`` per frame."""
    t, h, w = grid
    if t == 1:
        return torch.ones((pixels.size(0) // merge**2,), dtype=torch.bool)
    frames = pixels.view(t, (h // merge) * (w // merge), -1)
    diff = torch.abs(frames[1:] - frames[:-1]).mean(dim=-1) * 255
    diff = torch.cat([torch.full_like(diff[0:1], threshold + 1), diff], dim=0)
    mask = diff > threshold
    mask[torch.nonzero(mask.sum(dim=1) < min_tokens)[:, 0], :min_tokens] = 1
    return mask.flatten()


def _video_pixels(t: int, h: int, w: int, merge: int, features: int, gen: torch.Generator, still: bool):
    """Random patches of one video in the processor's order (frame, merged token, its merge x merge patches). With
    ``still``, about half the tokens of each later frame repeat the previous frame's (a static background), which the
    compression then drops."""
    tokens, unit = (h // merge) * (w // merge), merge * merge
    pixels = torch.randn(t, tokens, unit * features, generator=gen)
    if still:
        for f in range(1, t):
            same = torch.rand(tokens, generator=gen) < 0.5
            pixels[f, same] = pixels[f - 1, same]
    return pixels.reshape(t * tokens * unit, features)


@batch_builder()
def build_videollama3_inputs(batch: Draft, *, compress: bool = True) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``VideoLlama3Processor`` lays them out: an image is ``t*h*w // 1`` placeholders; a video of
    t frames is, per frame, its timestamp ``"Time {s:.1f}s:"`` in text and the placeholders of the tokens its
    ``video_compression_mask`` keeps, frames joined by ``","``. ``image_merge_sizes`` / ``video_merge_sizes`` hold
    each item's merge (1 / 2); ``compress=False``: the processor's ``use_token_compression=False`` (all kept)."""
    config, gen = batch.config, batch.gen
    patch = config.vision_config.patch_size
    features = config.vision_config.num_channels * patch * patch
    items = {1: ([], []), 2: ([], [])}  # kind -> (grids, pixels)
    masks: list[torch.Tensor] = []

    def place(row: Row, item: Image | Video) -> None:
        if isinstance(item, Image):
            grid = item_grid(item, patch, IMAGE_MERGE, 1)
            items[1][0].append(grid)
            items[1][1].append(torch.randn(grid[0] * grid[1] * grid[2], features, generator=gen))
            row.add([config.image_token_id] * (grid[0] * grid[1] * grid[2] // IMAGE_MERGE**2), 1)
            return
        grid = item_grid(item, patch, VIDEO_MERGE, 1)
        pixels = _video_pixels(*grid, VIDEO_MERGE, features, gen, still=compress)
        mask = (compression_mask(pixels, grid, VIDEO_MERGE) if compress
                else torch.ones(grid[0] * grid[1] * grid[2] // VIDEO_MERGE**2, dtype=torch.bool))
        items[2][0].append(grid)
        items[2][1].append(pixels)
        masks.append(mask)
        for f, frame in enumerate(mask.split(mask.numel() // grid[0])):
            if f:
                row.text(1)  # ","
            row.text(len(f"Time {f / item.fps:.1f}s:") // 3)  # about as many tokens as a tokenizer makes
            row.add([config.video_token_id] * int(frame.sum()), 2)

    out = batch.packed(batch.rows(place, avoid={config.image_token_id, config.video_token_id}),
                       typed=False)  # (the processor returns no token types)
    for kind, pixels_name, prefix, merge in ((1, "pixel_values", "image", IMAGE_MERGE),
                                             (2, "pixel_values_videos", "video", VIDEO_MERGE)):
        grids, pixels = items[kind]
        if grids:
            out[pixels_name] = torch.cat(pixels)
            out[f"{prefix}_grid_thw"] = torch.tensor(grids, dtype=torch.long)
            out[f"{prefix}_merge_sizes"] = torch.full((len(grids),), merge, dtype=torch.long)
    if masks:
        out["video_compression_mask"] = torch.cat(masks)
    return out


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_videollama3_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"video_llama_3": "VideoLLaMA3"})
