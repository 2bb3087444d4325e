"""Images and videos per batch row, kept with a plan so ``generate()`` with beams can rebuild it for the expanded
batch (``Plan.expanded``): by placeholder runs where 3D positions give runs meaning, else by placeholder counts."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from .spec import ModelSpec
from .tensors import host_array
from .token_types import Runs
from .vision import VisionPlan

__all__ = ["items_per_row", "items_per_row_by_count", "kept_sizes"]


def items_per_row_by_count(runs: Runs, image: VisionPlan | None, video: VisionPlan | None, host: dict) -> dict:
    """Images and videos per row where placeholder runs carry no meaning (no 3D positions, so two items may
    touch): each row takes the next items until its placeholder count is reached, as stock scatters features
    in order. Where a row's count ends inside an item, no split is kept (``expanded`` then refuses)."""
    found = {}
    for kind, vp, name in ((1, image, "images_per_row"), (2, video, "videos_per_row")):
        if vp is None:
            found[name] = ()
            continue
        chosen = runs.kinds == kind
        tokens = np.bincount(runs.rows[chosen], weights=runs.lengths[chosen], minlength=runs.n_rows)
        if kind == 2:  # (a compressed video: what it keeps)
            sizes = np.asarray(kept_sizes(host, vp), dtype=np.int64)
        else:
            sizes = vp.split_array if vp.split_array is not None else np.asarray(vp.split_sizes, dtype=np.int64)
        ends = np.cumsum(sizes)
        row_ends = np.cumsum(tokens.astype(np.int64))
        # Each row must end where an item ends (or before the first): a lookup in the sorted ends, not ``np.isin``
        # (which sorts both sides: a NaViT batch has thousands of crops).
        bounds = np.concatenate(([0], ends))
        at = np.minimum(np.searchsorted(bounds, row_ends), bounds.shape[0] - 1)
        if (bounds[at] == row_ends).all():
            found[name] = tuple(np.diff(np.searchsorted(ends, row_ends, side="right"), prepend=0).tolist())
        else:
            found[name] = ()
    return found


def kept_sizes(host: dict, video: VisionPlan) -> list[int]:
    """The features each video keeps: its split size, less those ``video_compression_mask`` drops."""
    mask = host.get("video_compression_mask")
    if not isinstance(mask, torch.Tensor) or mask.shape != (sum(video.split_sizes),):
        return list(video.split_sizes)
    return [int(np.count_nonzero(host_array(c))) for c in torch.split(mask, list(video.split_sizes))]


def items_per_row(spec: ModelSpec, runs: Runs, video: VisionPlan | None) -> dict:
    """Images and videos per row, kept to rebuild the plan for an expanded batch (generate with beams)."""
    frames_per_row = runs.per_row(2)
    videos_per_row = list(frames_per_row)
    if video is not None and spec.video.frames_as_runs:  # one run per frame
        frames = list(itertools.accumulate(t for t, _, _ in video.grid_thw.tolist()))
        done, videos_per_row = 0, []
        for n in frames_per_row:
            done += n
            videos_per_row.append(sum(1 for f in frames if f <= done) - sum(videos_per_row))
    return dict(images_per_row=runs.per_row(1), videos_per_row=tuple(videos_per_row))
