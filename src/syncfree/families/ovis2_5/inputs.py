"""Ovis2.5's batches laid out exactly as ``Ovis2_5Processor`` lays them out, without a tokenizer.

The processor writes an image as ``<image_start>`` + ``t*h*w // merge**2`` image placeholders + ``<image_end>``, a
video as ``<video_start>`` + its ``t*h*w // merge**2`` video placeholders (all frames in one run) + ``<video_end>``;
the four boundary tokens are the config's ids (``image_start_token_id`` ...), which the forward replaces by the
visual indicator embeddings. It returns no ``mm_token_type_ids`` by default. Pixels are flat patches of
``channels * temporal_patch_size * patch**2`` values in the order (channel, temporal, row, column) of each patch:
an image's one frame repeated over the temporal patch inside each channel (the image processor's ``expand``), a
video padded to whole temporal patches with its last frame (``ceil(frames / temporal_patch_size)`` grid rows).
Grids are listed in order of appearance across the batch; rows are padded to the longest (left by default).
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Video, batch_builder

__all__ = ["build_ovis_inputs", "boundary_ids"]


def boundary_ids(config) -> dict[str, int]:
    """The config's four boundary token ids, by name (``image_start`` ...)."""
    return {f"{kind}_{edge}": getattr(config, f"{kind}_{edge}_token_id") for kind in ("image", "video")
            for edge in ("start", "end")}


def _grid(item: Image | Video, patch: int, merge: int, temporal_patch: int) -> tuple[int, int, int]:
    unit = patch * merge
    if item.height % unit or item.width % unit or item.height <= 0 or item.width <= 0:
        raise ValueError(f"{item}: height and width must be positive multiples of {unit} pixels")
    if isinstance(item, Video) and item.frames <= 0:
        raise ValueError(f"{item}: frames must be positive")
    t = -(-item.frames // temporal_patch) if isinstance(item, Video) else 1  # (frames padded with the last one)
    return t, item.height // patch, item.width // patch


@batch_builder()
def build_ovis_inputs(batch: Draft) -> dict[str, torch.Tensor]:
    """Processor-style inputs for ``samples`` (lists of ``Text``, ``Image`` and ``Video`` items) under ``config``."""
    config = batch.config
    vc = config.vision_config
    patch, merge, tpatch, channels = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size, vc.num_channels
    marks = boundary_ids(config)
    grids, pixels = {"image": [], "video": []}, {"image": [], "video": []}

    def place(row: Row, item: Image | Video) -> None:
        kind = "image" if isinstance(item, Image) else "video"
        t, h, w = _grid(item, patch, merge, tpatch)
        grids[kind].append((t, h, w))
        if kind == "image":  # one frame, repeated over the temporal patch within each channel
            frame = torch.randn(h * w, channels, 1, patch * patch, generator=batch.gen)
            pixels[kind].append(frame.expand(-1, -1, tpatch, -1).reshape(h * w, -1))
        else:
            pixels[kind].append(torch.randn(t * h * w, channels * tpatch * patch * patch, generator=batch.gen))
        token = config.image_token_id if kind == "image" else config.video_token_id
        row.add([marks[f"{kind}_start"]] + [token] * (t * h * w // merge**2) + [marks[f"{kind}_end"]])

    specials = {config.image_token_id, config.video_token_id, *marks.values()}
    out = batch.packed(batch.rows(place, avoid=specials), typed=False)  # (the processor types none unless asked)
    for kind, name in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        if grids[kind]:
            out[name] = torch.cat(pixels[kind])
            out[f"{kind}_grid_thw"] = torch.tensor(grids[kind], dtype=torch.long)
    return out
