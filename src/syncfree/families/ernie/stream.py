"""ERNIE-4.5-VL in a traced forward of a stream (``Layout.stream``): its resampler's ``_temporal_slicing`` walks the
items' grid rows to pair each video's frames (an image's one frame with itself), building the pairs' indices on the
host, which Dynamo would unroll into a graph per layout. There it runs inside one operator
(``syncfree::ernie_temporal_slices``) that takes the plan's host grid (reading it waits for no device) and calls the
stock method itself: the same indices, the same ``index_select``s, so the outputs are the eager ones bit for bit; its
backward runs it again under autograd. Its output rows are the placeholders of the call's kind (an image's merged
patches; a video's frame pairs'), a size the graph holds as a symbol (``Plan.carriers``); the features' split per item
is then one piece of that size, which the forward concatenates again.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import torch

from ...rewrite.helpers import grid_products, placeholder_carrier, traced_stream_plan
from ...rewrite.recomputed_op import recomputed_op

__all__ = ["temporal_slices", "video_feature_sizes"]

_MODELING = "transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe"


def _slices(hidden: torch.Tensor, grid: torch.Tensor, merge: int) -> torch.Tensor:
    # (the class's own method; it reads nothing of ``self`` but the merge)
    resampler = importlib.import_module(_MODELING).Ernie4_5_VLMoeVariableResolutionResamplerModel
    return resampler._temporal_slicing(SimpleNamespace(spatial_merge_size=merge), hidden, grid)


_slices_op = recomputed_op("syncfree::ernie_temporal_slices", _slices,
                           lambda hidden, grid, merge, rows: hidden.new_empty((rows.shape[0], 2 * hidden.shape[-1])),
                           sized_by=("rows",))


def temporal_slices(slicing, hidden_states: torch.Tensor, grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """``slicing(hidden_states, grid_thw)`` (stock's ``self._temporal_slicing``); in a traced stream forward one
    operator over the plan's host grid."""
    vp = traced_stream_plan(grid_thw)
    if vp is None or not isinstance(merge, int):
        return slicing(hidden_states, grid_thw)
    return _slices_op(hidden_states, vp.grid_thw, merge, placeholder_carrier(vp))


def video_feature_sizes(video_grid_thw: torch.Tensor, merge: int, temporal_merge: int) -> list:
    """``(video_grid_thw.prod(-1) // merge**2 // temporal_merge).tolist()``, from the plan's rows in a traced forward;
    in a stream's, one piece of every video's features (the forward concatenates the pieces again)."""
    vp = traced_stream_plan(video_grid_thw)
    if vp is not None:
        return [placeholder_carrier(vp).shape[0]]
    return [p // merge**2 // temporal_merge for p in grid_products(video_grid_thw)]
