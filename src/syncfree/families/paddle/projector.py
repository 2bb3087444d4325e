"""PaddleOCR-VL's projector in a traced forward of a stream (``Layout.stream``): stock merges each image's
``m x m`` blocks of raster patches and runs its two linear layers per image, in a loop over the grid rows, which
Dynamo would unroll into a graph per image count. Here the loop runs once, over all images:

* ``block_chunks``: one chunk, the features gathered into block order (for each merged token, its ``m x m`` patches
  row after row), by a gather index made in the graph from the plan's per-image columns (no host loop);
* ``block_rows``: one row for that chunk, ``(tokens, m, m)``: stock's reshape and transpose then leave the block
  order as it is and make the same ``(tokens, m * m * width)`` rows;
* ``item_linear``: each linear layer one call per image inside one operator (``syncfree::segment_linear``, the
  images' token counts from the plan's host lengths): a matmul over all rows at once rounds differently.

Outside a traced stream forward the chunks and rows are stock's (``grid_products``, ``grid_rows``: the edits fall back
to them) and the layer's call is stock's.
"""

from __future__ import annotations

import torch

from ...plan.vision_tables import ITEM
from ...rewrite.helpers import traced_stream_plan
from ...rewrite.segment_op import segment_linear_op

__all__ = ["block_chunks", "block_rows", "item_linear"]

_I = {name: i for i, name in enumerate(ITEM)}


def _block_order(items: torch.Tensor, total: int, m1: int, m2: int) -> torch.Tensor:
    """For each place in block order (image after image, merged tokens row after row, each one's ``m1 x m2`` patches
    row after row), the raster patch that goes there: elementwise from its image's columns of ``items``."""
    which = torch.repeat_interleave(items[_I["count"]], output_size=total)
    per = items.index_select(1, which)
    local = torch.arange(total, device=items.device) - per[_I["start"]]
    width = per[_I["width"]]
    within = local % per[_I["frame"]]
    block = within // (m1 * m2)
    across = width // m2
    row = block // across * m1 + within // m2 % m1
    col = block % across * m2 + within % m2
    return per[_I["start"]] + local - within + row * width + col


def block_chunks(image_features: torch.Tensor, image_grid_thw: torch.Tensor, kernel) -> tuple | None:
    """In a traced stream forward the projector's chunks, one: all features in block order; else None (stock's split,
    ``grid_products``)."""
    vp = traced_stream_plan(image_grid_thw)
    if vp is None:
        return None
    order = _block_order(vp.items, image_features.shape[0], *kernel)
    return (image_features.index_select(0, order),)


def block_rows(image_grid_thw: torch.Tensor, chunks, kernel) -> list | None:
    """What the projector's loop takes as its chunk's grid row in a traced stream forward: one row ``(tokens, m1, m2)``
    for the one chunk in block order; else None (stock's rows, ``grid_rows``)."""
    if traced_stream_plan(image_grid_thw) is None:
        return None
    m1, m2 = kernel
    return [(chunks[0].shape[0] // (m1 * m2), m1, m2)]


def item_linear(linear, x: torch.Tensor, image_grid_thw: torch.Tensor, kernel) -> torch.Tensor:
    """``linear(x)``: in a traced stream forward, over all images' rows, one call per image (one operator)."""
    vp = traced_stream_plan(image_grid_thw)
    if vp is None:
        return linear(x)
    m1, m2 = kernel
    return segment_linear_op(linear, x, vp.host_seqlens // (m1 * m2))
