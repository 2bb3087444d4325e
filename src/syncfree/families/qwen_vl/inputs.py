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

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Union

import torch

from ...plan.errors import InputsNotTaken
from ...plan.spec import Layout, layout_of

__all__ = ["Image", "Video", "Text", "build_inputs", "named_layout", "LAYOUT_NAMES", "item_grid", "frame_timestamps",
           "pack_rows", "pixel_inputs", "check_padding_side", "random_text", "check_items", "VISUAL_ITEMS"]


@dataclass(frozen=True)
class Image:
    height: int  # pixels, after the processor's resize (a multiple of patch_size * merge_size)
    width: int


@dataclass(frozen=True)
class Video:
    frames: int  # sampled frames, a multiple of the temporal patch size
    height: int
    width: int
    fps: float = 2.0  # sampling rate of those frames, for the timestamps


@dataclass(frozen=True)
class Text:
    tokens: int


Item = Union[Image, Video, Text]


def frame_timestamps(frames: int, fps: float, temporal_patch: int) -> list[float]:
    # The processor averages the times of the frames merged into one temporal patch.
    times = [i / fps for i in range(frames)]
    return [(times[i] + times[i + temporal_patch - 1]) / 2 for i in range(0, frames, temporal_patch)]


def item_grid(item: Image | Video, patch: int, merge: int, temporal_patch: int) -> tuple[int, int, int]:
    unit = patch * merge
    if item.height % unit or item.width % unit or item.height <= 0 or item.width <= 0:
        raise ValueError(f"{item}: height and width must be positive multiples of {unit} pixels")
    t = 1
    if isinstance(item, Video):
        if item.frames <= 0 or item.frames % temporal_patch:
            raise ValueError(f"{item}: frames must be a positive multiple of {temporal_patch}")
        t = item.frames // temporal_patch
    return t, item.height // patch, item.width // patch


# The items a processor takes where its family group does not say otherwise (``ITEMS``): text, images and videos.
VISUAL_ITEMS = (Text, Image, Video)


def check_items(model_type: str, samples, takes: tuple[type, ...] = VISUAL_ITEMS) -> None:
    """Refuse, in one line, a batch that is not a list of samples (each a list of items) or holds an item the
    family's processor does not take (an audio clip for a vision-only family, a string for ``Text(n)``)."""
    if not isinstance(samples, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in samples):
        raise TypeError(f"samples must be a list of samples, each a list of items (e.g. [[Text(4), Image(448, 448)]]), "
                        f"got {samples!r}")
    for sample in samples:
        for item in sample:
            if not isinstance(item, takes):
                names = ", ".join(t.__name__ for t in takes[:-1]) + f" and {takes[-1].__name__}"
                raise InputsNotTaken(f"{model_type} takes {names} items, got {item!r}")

def check_padding_side(padding_side: str) -> None:
    """Refuse a padding side a processor does not take."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")


def random_text(gen: torch.Generator, high: int, avoid: Collection[int], low: int = 1) -> Callable[[int], list[int]]:
    """``text(n)``: ``n`` random token ids in ``[low, high)`` drawn from ``gen``, each id in ``avoid`` (the family's
    special tokens, and the pad where the family's rows are padded) replaced by 1, so that a run of text never reads
    as a placeholder, a marker or padding."""

    def text(n: int) -> list[int]:
        return [i if i not in avoid else 1 for i in torch.randint(low, high, (n,), generator=gen).tolist()]

    return text


def build_inputs(config, samples: list[list[Item]], *, padding_side: str = "left", seed: int = 0,
                 pad_token_id: int | None = None) -> dict[str, torch.Tensor]:
    """Processor-style inputs for ``samples`` (one list of items per request) under ``config``."""
    check_padding_side(padding_side)
    check_items(config.model_type, samples)
    vc, tc = config.vision_config, config.text_config
    # (SigLIP-style towers, Cosmos3-Edge's: one frame per temporal step.)
    patch, merge, tpatch = vc.patch_size, vc.spatial_merge_size, getattr(vc, "temporal_patch_size", 1)
    layout = layout_of(config.model_type) or Layout("")
    # Families whose chat template (not the config) names the markers get none: the processor adds none.
    start, end = ([config.vision_start_token_id], [config.vision_end_token_id]) if layout.vision_markers else ([], [])
    specials = {config.image_token_id, config.video_token_id, *start, *end}
    pad = pad_token_id if pad_token_id is not None else (tc.pad_token_id or 0)
    gen = torch.Generator().manual_seed(seed)
    text_hi = min(specials | {tc.vocab_size}) if max(specials) < tc.vocab_size else tc.vocab_size

    text = random_text(gen, text_hi, specials | {pad})

    timestamps = layout.frames_as_runs  # Qwen3-VL: one run per frame, timestamps between
    rows, types, image_grids, video_grids, seconds = [], [], [], [], []
    for sample in samples:
        ids: list[int] = []
        kinds: list[int] = []
        for item in sample:
            if isinstance(item, Text):
                ids += text(item.tokens)
                kinds += [0] * item.tokens
                continue
            t, h, w = item_grid(item, patch, merge, tpatch)
            per_frame = h * w // (merge * merge)
            edge = [0] * len(start)
            if isinstance(item, Image):
                image_grids.append((t, h, w))
                ids += start + [config.image_token_id] * per_frame + end
                kinds += edge + [1] * per_frame + edge
            elif not timestamps:
                video_grids.append((t, h, w))
                seconds.append(tpatch / item.fps)
                ids += start + [config.video_token_id] * (t * per_frame) + end
                kinds += edge + [2] * (t * per_frame) + edge
            else:
                video_grids.append((t, h, w))
                for stamp in frame_timestamps(item.frames, item.fps, tpatch):
                    n_stamp = len(f"<{stamp:.1f} seconds>") // 3  # about as many tokens as a tokenizer makes
                    ids += text(n_stamp) + start + [config.video_token_id] * per_frame + end
                    kinds += [0] * n_stamp + edge + [2] * per_frame + edge
        rows.append(ids)
        types.append(kinds)

    out = pack_rows(rows, types, pad, padding_side)
    if not layout.token_types:
        del out["mm_token_type_ids"]
    out.update(pixel_inputs(vc, image_grids, video_grids, gen, layout.pixels_4d))
    if video_grids and layout.video_time_scale:
        out["second_per_grid_ts"] = torch.tensor(seconds)
    return out


def pack_rows(rows: list[list[int]], types: list[list[int]], pad: int, padding_side: str) -> dict:
    """``input_ids``, ``attention_mask`` and ``mm_token_type_ids`` for token rows padded to the longest."""
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    mm_token_type_ids = torch.zeros((len(rows), length), dtype=torch.long)
    for b, (ids, kinds) in enumerate(zip(rows, types)):
        span = slice(length - len(ids), length) if padding_side == "left" else slice(0, len(ids))
        input_ids[b, span] = torch.tensor(ids, dtype=torch.long)
        attention_mask[b, span] = 1
        mm_token_type_ids[b, span] = torch.tensor(kinds, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "mm_token_type_ids": mm_token_type_ids}


def pixel_inputs(vision_config, image_grids: list, video_grids: list, gen: torch.Generator,
                 pixels_4d: bool = False) -> dict:
    """Random flattened patches and their grids, as the image and video processors return them (``pixels_4d``:
    each patch as (channels, patch, patch), as PaddleOCR-VL's image processor returns it)."""
    vc = vision_config
    channels = getattr(vc, "in_channels", None) or vc.num_channels  # (SigLIP-style configs: num_channels)
    features = channels * getattr(vc, "temporal_patch_size", 1) * vc.patch_size * vc.patch_size
    out = {}
    for grids, pixels, name in ((image_grids, "pixel_values", "image_grid_thw"),
                                (video_grids, "pixel_values_videos", "video_grid_thw")):
        if grids:
            grid = torch.tensor(grids, dtype=torch.long)
            out[pixels] = torch.randn(int(grid.prod(-1).sum()), features, generator=gen)
            if pixels_4d:
                out[pixels] = out[pixels].reshape(-1, channels, vc.patch_size, vc.patch_size)
            out[name] = grid
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
