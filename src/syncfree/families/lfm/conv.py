"""LFM3-VL's tower convolution in a traced forward of a stream (``Layout.stream``).

Stock's ``Lfm3VlVisionShortConv`` rasters each image's or video's frames to their grid, convolves them and goes back,
in a loop over the grid list the tower reads with ``grid_thw.tolist()``: unrolled by Dynamo, a graph per layout. In a
traced stream forward the tower is handed the plan's host grid as it is (``helpers.grid_list``) and the loop runs inside
one operator that takes it (``syncfree::lfm3_frame_convs``: reading a host tensor waits for no device): the very
calls of stock's loop, in its order, so the outputs are the eager ones bit for bit. Its backward runs them again
under autograd (as the vision attention's segment operator does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...rewrite.segment_op import autograd_inside, laid_out_like

__all__ = ["frame_convs", "convolves_in_one"]


def convolves_in_one(grid_thw) -> bool:
    """Whether the convolution's loop runs as one operator: its grid is a (host) tensor, ``grid_list``'s in a traced
    stream forward."""
    return isinstance(grid_thw, torch.Tensor)


def _convs(gated, grid, weight, merge: int, padding: int):
    """Stock's loop (``Lfm3VlVisionShortConv.forward``), its ``self.spatial_conv`` as the same ``conv2d`` call."""
    rows = grid.tolist()
    channels = gated.shape[-1]
    outputs = []
    for frames, (temporal, height, width) in zip(torch.split(gated, [t * h * w for t, h, w in rows], dim=0), rows):
        frames = frames.view(temporal, height // merge, width // merge, merge, merge, channels)
        frames = frames.permute(0, 5, 1, 3, 2, 4).reshape(temporal, channels, height, width)
        frames = F.conv2d(frames, weight, None, 1, padding, 1, channels)
        frames = frames.view(temporal, channels, height // merge, merge, width // merge, merge)
        outputs.append(frames.permute(0, 2, 4, 3, 5, 1).reshape(temporal * height * width, channels))
    return torch.cat(outputs, dim=0)


@torch.library.custom_op("syncfree::lfm3_frame_convs", mutates_args=())
def _frame_convs(gated: torch.Tensor, grid: torch.Tensor, weight: torch.Tensor, merge: int,
                 padding: int) -> torch.Tensor:
    with torch.no_grad():
        return _convs(gated, grid, weight, merge, padding)


@_frame_convs.register_fake
def _(gated, grid, weight, merge, padding):
    return torch.empty_like(gated, memory_format=torch.contiguous_format)


@torch.library.custom_op("syncfree::lfm3_frame_convs_backward", mutates_args=())
def _frame_convs_backward(grad: torch.Tensor, gated: torch.Tensor, grid: torch.Tensor, weight: torch.Tensor,
                          merge: int, padding: int) -> list[torch.Tensor]:
    with autograd_inside(), torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (gated, weight)]
        out = _convs(leaves[0], grid, leaves[1], merge, padding)
        return [laid_out_like(g, t) for g, t in zip(torch.autograd.grad(out, leaves, grad), (gated, weight))]


@_frame_convs_backward.register_fake
def _(grad, gated, grid, weight, merge, padding):
    return [torch.empty_like(gated), torch.empty_like(weight)]


def _setup_context(ctx, inputs, output):
    gated, grid, weight, merge, padding = inputs
    ctx.save_for_backward(gated, grid, weight)
    ctx.options = (merge, padding)


def _backward(ctx, grad):
    gated, grid, weight = ctx.saved_tensors
    d_gated, d_weight = _frame_convs_backward(grad, gated, grid, weight, *ctx.options)
    return d_gated, None, d_weight, None, None


_frame_convs.register_autograd(_backward, setup_context=_setup_context)


def frame_convs(conv: torch.nn.Conv2d, gated: torch.Tensor, grid: torch.Tensor, merge: int) -> torch.Tensor:
    """The stock loop's concatenated outputs over the host ``grid``, as one operator."""
    return _frame_convs(gated, grid, conv.weight, merge, int(conv.padding[0]))
