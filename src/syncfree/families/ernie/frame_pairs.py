"""ERNIE-4.5-VL's own rewrite helper for its resampler (its ``Family.helpers``, with ``modality_moe``'s): the rows its
``_temporal_slicing`` pairs each item's frames by, in a traced forward (a stream's runs the whole method as one
operator instead: ``stream.py``).

Stock walks the grid's rows (``zip`` over its columns: host values in eager, where the patched forward hands it the
host grid) and builds the frame pairs' indices on the host. A traced forward cannot read a grid's values; there the
plan's rows of that grid give the same ints (``rewrite.helpers.traced_grid_rows``).
"""

from __future__ import annotations

import torch

from ...rewrite.helpers import traced_grid_rows

__all__ = ["frame_pair_rows"]


def frame_pair_rows(grid_thw: torch.Tensor, merge: int, grid_t, grid_hw_after_conv, batch_offsets):
    """``zip(grid_t, grid_hw_after_conv, batch_offsets)``: each item's frames, merged tokens per frame and first token,
    from the plan's rows in a traced forward (the same values: ``grid_thw.prod(-1) // merge**2`` summed before each
    item); stock's ``zip`` over the tensors otherwise."""
    rows = traced_grid_rows(grid_thw)
    if rows is None:
        return zip(grid_t, grid_hw_after_conv, batch_offsets)
    found, offset = [], 0
    for t, h, w in rows:
        found.append((t, h * w // merge**2, offset))
        offset += t * h * w // merge**2
    return found
