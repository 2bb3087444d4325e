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
from ...rewrite.segment_op import autograd_inside, laid_out_like

__all__ = ["resized_positions"]

_MODELING = "transformers.models.cosmos3_edge.modeling_cosmos3_edge"


def _resize(table, grid, merge: int):
    embeddings = importlib.import_module(_MODELING).Cosmos3EdgeVisionEmbeddings
    return embeddings.resize_positional_embeddings(table, grid, merge)


@torch.library.custom_op("syncfree::cosmos3_positions", mutates_args=())
def _positions(table: torch.Tensor, grid: torch.Tensor, patches: torch.Tensor, merge: int) -> torch.Tensor:
    with torch.no_grad():
        return _resize(table, grid, merge)


@_positions.register_fake
def _(table, grid, patches, merge):
    # (stock's float32 upcast on the CPU, cast back: the table's dtype; one row per patch)
    return table.new_empty((patches.shape[0], table.shape[-1]))


@torch.library.custom_op("syncfree::cosmos3_positions_backward", mutates_args=())
def _positions_backward(grad: torch.Tensor, table: torch.Tensor, grid: torch.Tensor, merge: int) -> torch.Tensor:
    with autograd_inside(), torch.enable_grad():
        leaf = table.detach().requires_grad_(True)
        (d_table,) = torch.autograd.grad(_resize(leaf, grid, merge), [leaf], grad)
        return laid_out_like(d_table, table)


@_positions_backward.register_fake
def _(grad, table, grid, merge):
    return torch.empty_like(table)


def _setup_context(ctx, inputs, output):
    table, grid, _patches, merge = inputs
    ctx.save_for_backward(table, grid)
    ctx.merge = merge


def _backward(ctx, grad):
    table, grid = ctx.saved_tensors
    return _positions_backward(grad, table, grid, ctx.merge), None, None, None


_positions.register_autograd(_backward, setup_context=_setup_context)


def resized_positions(resize, table: torch.Tensor, grid_thw: torch.Tensor, merge: int, patch_embeds: torch.Tensor):
    """``resize(table, grid_thw, merge)`` (stock's ``self.resize_positional_embeddings``); in a traced stream forward
    one operator over the plan's host grid, sized by ``patch_embeds``."""
    vp = traced_vision_plan(grid_thw)
    if vp is None or vp.host_seqlens is None:
        return resize(table, grid_thw, merge)
    return _positions(table, vp.grid_thw, patch_embeds, merge)
