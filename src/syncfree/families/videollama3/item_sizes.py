"""VideoLLaMA3's own rewrite helpers for its per-item sizes (its ``Family.helpers``, with ``compression``).

Its images and videos come with their own merge sizes, and stock splits and loops over them by values it takes out
of the grid and merge-size tensors: host tensors on the eager path (no sync), which a traced forward cannot read. In
a traced forward with a plan these give the plan's integers for the very tensors the forward was given (the same
values); stock's expression otherwise (``PIXEL_UNSHUFFLE``, ``ITEM_SPLIT`` in ``edits.py`` call them).
"""

from __future__ import annotations

import torch

from ...rewrite.helpers import traced_vision_plan

__all__ = ["merge_values", "item_split_sizes"]


def merge_values(merge_sizes: torch.Tensor):
    """What ``zip(..., merge_sizes)`` iterates: the per-item merge sizes, or in a traced forward the plan's as ints."""
    vp = traced_vision_plan(merge_sizes, "merge_sizes")
    return merge_sizes if vp is None or not vp.merges else vp.merges


def item_split_sizes(split_sizes: torch.Tensor, grid_thw: torch.Tensor, merge_sizes: torch.Tensor, features=None):
    """``split_sizes.tolist()`` for ``split_sizes = grid_thw.prod(dim=1) // (merge_sizes**2)`` (the features of each
    item), from the plan's rows and merges in a traced forward; in a traced forward of a stream one piece, the whole
    ``features`` (the forward concatenates the pieces again; a split per item would be a graph per item count)."""
    vp = traced_vision_plan(grid_thw)
    if vp is None or vp.merge_sizes is None or traced_vision_plan(merge_sizes, "merge_sizes") is not vp:
        return split_sizes.tolist()  # (not the call's own pair: stock's expression)
    if features is not None and vp.host_seqlens is not None:
        return [features.shape[0]]
    return [t * h * w // m**2 for (t, h, w), m in zip(vp.rows, vp.merges)]
