"""HunYuan-VL's and HY-V4-VL's own rewrite helper for their feature split (their ``Family.helpers``).

``get_image_features`` splits the merger's output per item by sizes it computes from the grid (each merged row with
its newline column; HunYuan-VL's begin and end embeddings): a host grid on the eager path (no sync), which a traced
forward cannot read. In a traced forward with a plan, the plan's per-item counts for that very grid (the same values:
``TowerShape``'s ``row_extra_tokens`` / ``item_extra_tokens`` say what the merger adds), or in a traced forward of a
stream the whole output in one piece; stock's expression otherwise.
"""

from __future__ import annotations

import torch

from ...rewrite.helpers import traced_vision_plan

__all__ = ["planned_feature_sizes"]


def planned_feature_sizes(sizes: torch.Tensor, grid_thw: torch.Tensor, features: torch.Tensor):
    """``sizes.tolist()`` for ``sizes``, the features of each item of ``grid_thw`` as stock computes them from it: in a
    traced forward the plan's own per-item counts for that grid (a value Dynamo could not take out of the tensor); in
    a traced forward of a stream one piece, all of ``features`` (the merger's output, ``(1, features, width)``: the
    forward concatenates the pieces again, and a split per item would be a graph per item count)."""
    vp = traced_vision_plan(grid_thw)
    if vp is None:
        return sizes.tolist()
    return [features.shape[-2]] if vp.host_seqlens is not None else list(vp.split_sizes)
