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

from ...rewrite.recomputed_op import recomputed_op

__all__ = ["frame_convs", "convolves_in_one"]


def convolves_in_one(grid_thw) -> bool:
    """Whether the convolution's loop runs as one operator: its grid is a (host) tensor, ``grid_list``'s in a traced
    stream forward."""
    return isinstance(grid_thw, torch.Tensor)


def _convs(gated: torch.Tensor, weight: torch.Tensor, grid: torch.Tensor, merge: int, padding: int) -> torch.Tensor:
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


_frame_convs = recomputed_op("syncfree::lfm3_frame_convs", _convs,
                             lambda gated, *_: torch.empty_like(gated, memory_format=torch.contiguous_format),
                             differentiable=2)


def frame_convs(conv: torch.nn.Conv2d, gated: torch.Tensor, grid: torch.Tensor, merge: int) -> torch.Tensor:
    """The stock loop's concatenated outputs over the host ``grid``, as one operator."""
    return _frame_convs(gated, conv.weight, grid, merge, int(conv.padding[0]))
