"""MiniCPM's own rewrite helpers (its ``Family.helpers``: what its rewritten tower code calls under ``_syncfree``):
the planned cumulative lengths, and for the in-tower window merger ("16x") its window order and the segment sizes
before and after it.

The window merger keeps the number of segments and shrinks each 4x, so the split sizes the attention finds by segment
count cannot tell the two segmentations apart: the tower wrapper puts the merger's tables in ``MERGER`` for the
duration of the stock call, and the merger's edits take them from there, handing the post-merger layers their own
sizes.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import torch

__all__ = ["MergerTables", "MERGER", "navit_cu_seqlens", "navit_window_index", "navit_window_kwargs",
           "navit_merged_cu_seqlens"]


@dataclass
class MergerTables:
    """The window merger's tables for one call: stock's window order and window boundaries (made on the host from
    the host sizes, moved without a wait), the window sizes, and the segments after the merger."""

    window_index: torch.Tensor
    cu_window_seqlens: torch.Tensor
    window_seqlens: dict  # {len(cu_window_seqlens): sizes}
    merged_cu_seqlens: torch.Tensor
    merged_seqlens: dict  # {len(merged_cu_seqlens): sizes}


MERGER: contextvars.ContextVar[MergerTables | None] = contextvars.ContextVar("syncfree_navit_merger", default=None)


def navit_cu_seqlens(kwargs: dict, stock):
    """A NaViT tower's ``cu_seqlens`` (MiniCPM-V: ``cumsum(target_sizes ...).to(device)``, a copy from the host
    sizes the wrapper hands it): the plan's, which ``make_vision_forward_target_sizes`` put in the tower's kwargs.
    The position ids it put there too (the embeddings have taken them by now) leave with it, so they do not travel
    on into the attention functions. Without a plan: ``stock()``, the stock expression."""
    planned = kwargs.pop("syncfree_cu_seqlens", None)
    if planned is None:
        return stock()
    kwargs.pop("position_ids", None)
    return planned


def _tables() -> MergerTables | None:
    return MERGER.get()


def navit_window_index(merger, target_sizes, kwargs):
    """``self.get_window_index(target_sizes, kwargs=kwargs)``: the planned window order and boundaries (on the
    device already: stock's ``.to(device)`` after it is then no copy), else stock's."""
    tables = _tables()
    if tables is None:
        return merger.get_window_index(target_sizes, kwargs=kwargs)
    window_h, window_w = merger.window_kernel_size
    return tables.window_index, tables.cu_window_seqlens, window_h * window_w


def navit_window_kwargs(kwargs: dict) -> dict:
    """What the window attention is handed besides stock's arguments: the window sizes (and the attention backend
    the tower was given), so it splits by host sizes."""
    tables = _tables()
    out = {k: kwargs[k] for k in ("syncfree_attention",) if k in kwargs}
    if tables is not None:
        out["syncfree_seqlens"] = tables.window_seqlens
    return out


def navit_merged_cu_seqlens(kwargs: dict, stock):
    """The segments after the window merger (stock: ``cumsum(target_sizes // 2 ...).to(device)``): the planned
    ones; the layers after the merger get their sizes through ``kwargs`` (what the downsampled call passes on)."""
    tables = _tables()
    if tables is None:
        return stock()
    kwargs["syncfree_seqlens"] = tables.merged_seqlens
    return tables.merged_cu_seqlens
