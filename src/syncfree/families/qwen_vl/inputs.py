"""Model inputs laid out exactly as the Qwen-VL processors lay them out, without a tokenizer.

The processors turn each image into ``<|vision_start|>`` + one ``<|image_pad|>``
per merged patch + ``<|vision_end|>``. Qwen3-VL turns each video into, per
temporal patch, a timestamp in text (``<1.2 seconds>``) followed by start,
``<|video_pad|>`` per merged patch of that frame, and end; Qwen2-VL and
Qwen2.5-VL put the whole video between one start and end, and Qwen2.5-VL adds
``second_per_grid_ts`` (temporal patch size / fps per video). ``mm_token_type_ids`` marks image pads 1
and video pads 2; everything else, the start/end tokens included, is text (0).
A batch is padded (left by default, as for generation) and the grids are listed
in order of appearance across the batch. Pixel values are random (the processor
would normalize real pixels to about this range). All tensors are on the CPU,
as the processor returns them.
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Item, Row, Text, Video, batch_builder, frame_timestamps, item_grid, pixel_inputs
from ...plan.spec import Layout, layout_of

__all__ = ["build_inputs", "named_layout", "LAYOUT_NAMES"]


@batch_builder()
def build_inputs(batch: Draft) -> dict[str, torch.Tensor]:
    """Processor-style inputs for ``samples`` (one list of items per request) under ``config``."""
    config = batch.config
    vc, tc = config.vision_config, config.text_config
    # (SigLIP-style towers, Cosmos3-Edge's: one frame per temporal step.)
    patch, merge, tpatch = vc.patch_size, vc.spatial_merge_size, getattr(vc, "temporal_patch_size", 1)
    layout = layout_of(config.model_type) or Layout("")
    # Families whose chat template (not the config) names the markers get none: the processor adds none.
    start, end = ([config.vision_start_token_id], [config.vision_end_token_id]) if layout.vision_markers else ([], [])
    specials = {config.image_token_id, config.video_token_id, *start, *end}
    text_hi = min(specials | {tc.vocab_size}) if max(specials) < tc.vocab_size else tc.vocab_size
    timestamps = layout.video.frames_as_runs  # Qwen3-VL: one run per frame, timestamps between
    image_grids, video_grids, seconds = [], [], []

    def place(row: Row, item: Image | Video) -> None:
        t, h, w = item_grid(item, patch, merge, tpatch)
        per_frame = h * w // (merge * merge)
        edge = [0] * len(start)
        if isinstance(item, Image):
            image_grids.append((t, h, w))
            row.add(start + [config.image_token_id] * per_frame + end, edge + [1] * per_frame + edge)
        elif not timestamps:
            video_grids.append((t, h, w))
            seconds.append(tpatch / item.fps)
            row.add(start + [config.video_token_id] * (t * per_frame) + end, edge + [2] * (t * per_frame) + edge)
        else:
            video_grids.append((t, h, w))
            for stamp in frame_timestamps(item.frames, item.fps, tpatch):
                row.text(len(f"<{stamp:.1f} seconds>") // 3)  # about as many tokens as a tokenizer makes
                row.add(start + [config.video_token_id] * per_frame + end, edge + [2] * per_frame + edge)

    out = batch.packed(batch.rows(place, avoid=specials, high=text_hi), typed=layout.token_types)
    out.update(pixel_inputs(vc, image_grids, video_grids, batch.gen, layout.tower.pixels_4d))
    if video_grids and layout.video.time_scale:
        out["second_per_grid_ts"] = torch.tensor(seconds)
    return out


LAYOUT_NAMES = ("image", "images", "video", "mixed")


def named_layout(name: str, side: int = 448, unit: int = 32) -> list[list[Item]]:
    """The CLI's input kinds. ``side`` is the image side in pixels (448 for real presets, 64 for tiny);
    ``unit`` is patch size x merge size (32 for Qwen3-VL, 28 for Qwen2/2.5-VL)."""
    side = max(side // unit * unit, unit)
    half = max(side // 2 // unit * unit, unit)
    if name == "image":
        return [[Text(12), Image(side, side), Text(20)]]
    if name == "images":
        return [[Text(12), Image(side, side), Text(3), Image(half, side), Text(3), Image(side, half), Text(20)]]
    if name == "video":
        return [[Text(12), Video(8, side, side), Text(20)]]
    if name == "mixed":
        # Two requests, left-padded: an image and a video in the first, one smaller image in the second.
        return [
            [Text(12), Image(side, side), Text(4), Video(4, half, half), Text(20)],
            [Text(8), Image(half, half), Text(10)],
        ]
    raise ValueError(f"unknown input kind {name!r}; choose one of {', '.join(LAYOUT_NAMES)}")
