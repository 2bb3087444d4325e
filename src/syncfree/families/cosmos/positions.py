"""Cosmos3-Edge's position resampling in a traced forward of a stream (``Layout.stream``).

Stock's ``Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings`` resamples its learned table to every grid row in
a loop over ``grid_thw.tolist()`` (``F.interpolate`` to each image's size): unrolled by Dynamo, a graph per layout.
In a traced stream forward the resampling runs inside one operator (``syncfree::cosmos3_positions``) that takes the
plan's host grid (reading it waits for no device) and calls the stock function itself: the same calls in the same
order, so the outputs are the eager ones bit for bit. The patch embeddings it is added to give its size (the pixels'
patch count, a size Dynamo keeps dynamic). Its backward runs the resampling again under autograd.
"""

from __future__ import annotations

import importlib

import torch

from ...rewrite.helpers import traced_vision_plan
from ...rewrite.recomputed_op import recomputed_op

__all__ = ["resized_positions"]

_MODELING = "transformers.models.cosmos3_edge.modeling_cosmos3_edge"


def _resize(table: torch.Tensor, grid: torch.Tensor, merge: int) -> torch.Tensor:
    embeddings = importlib.import_module(_MODELING).Cosmos3EdgeVisionEmbeddings
    return embeddings.resize_positional_embeddings(table, grid, merge)


# (stock's float32 upcast on the CPU, cast back: the table's dtype; one row per patch)
_positions = recomputed_op("syncfree::cosmos3_positions", _resize,
                           lambda table, grid, merge, patches: table.new_empty((patches.shape[0], table.shape[-1])),
                           sized_by=("patches",))


def resized_positions(resize, table: torch.Tensor, grid_thw: torch.Tensor, merge: int, patch_embeds: torch.Tensor):
    """``resize(table, grid_thw, merge)`` (stock's ``self.resize_positional_embeddings``); in a traced stream forward
    one operator over the plan's host grid, sized by ``patch_embeds``."""
    vp = traced_vision_plan(grid_thw)
    if vp is None or vp.host_seqlens is None:
        return resize(table, grid_thw, merge)
    return _positions(table, vp.grid_thw, merge, patch_embeds)
