"""MiniCPM's own rewrite helpers (its ``Family.helpers``: what its rewritten tower code calls under ``_syncfree``):
the planned cumulative lengths, and for the in-tower window merger ("16x") its window order and the segment sizes
before and after it.

The window merger keeps the number of segments and shrinks each 4x, so the split sizes the attention finds by segment
count cannot tell the two segmentations apart: the tower wrapper puts the merger's tables in ``MERGER`` for the
duration of the stock call, and the merger's edits take them from there, handing the post-merger layers their own
sizes.

In a forward that Dynamo traces whole (``Layout.one_graph``) a ContextVar cannot be read, and a size tensor's values
cannot be read either: there every crop size comes from the plan's rows as Python ints. The call's own
``target_sizes`` / ``target_sizes_videos`` are known by identity (``traced_crops``); the tensors stock derives from
them (the video frames' ``repeat``, the merges' ``// 2``) are noted with their rows as they are made
(``frame_sizes``, ``halved_sizes``), and the window tables are built in the graph from those rows.

In a traced forward of a stream (``Layout.stream``: a plan made with host lengths) no row is read, as a row read is a
guard, a graph per layout: the same tensors are found and noted with the crops' sizes as a host tensor instead
(``stream_crops``), which the merger's and window merger's operators take (``merger``), and the segments after the
window merger are made on the device from the plan's grid there (``navit_merged_cu_seqlens``).
"""

from __future__ import annotations

import contextvars
import itertools
from dataclasses import dataclass

import torch

from ...plan import active
from ...rewrite.host_index import host_index_to
from ...rewrite.segments import TracedSegments

__all__ = ["MergerTables", "MERGER", "navit_cu_seqlens", "navit_window_index", "navit_window_kwargs",
           "navit_merged_cu_seqlens", "merger_tables", "traced_crops", "stream_crops", "note_stream_crops",
           "halved_sizes", "frame_sizes", "crop_size", "window_order"]


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


def _merged_tokens(h, w):
    """A crop's tokens after the window merger's 2x2 merge, from its patch rows and columns (ints or tensors of
    them): stock's ``target_sizes // 2`` multiplied out."""
    return (h // 2) * (w // 2)


def merger_tables(merger, host_sizes: torch.Tensor, device) -> MergerTables:
    """The window merger's tables from the host sizes: stock's own ``get_window_index`` run on them (host tensors:
    no device involved), moved through pinned memory without a wait; the post-merger segments (``h*w // 4``)."""
    window_index, cu_window_seqlens, _ = merger.get_window_index(host_sizes)
    windows = torch.diff(cu_window_seqlens).tolist()  # (host tensors)
    merged = _merged_tokens(host_sizes[:, 0], host_sizes[:, 1]).tolist()
    merged_cu = torch.nn.functional.pad(torch.cumsum(torch.tensor(merged, dtype=torch.int32), 0, dtype=torch.int32),
                                        (1, 0))
    return MergerTables(host_index_to(window_index, device), host_index_to(cu_window_seqlens, device),
                        {len(windows) + 1: tuple(windows)}, host_index_to(merged_cu, device),
                        {len(merged) + 1: tuple(merged)})


def _tables() -> MergerTables | None:
    # (a forward traced whole with its plan sets none, and Dynamo cannot read a ContextVar: it would break there; a
    # tower compiled alone with its plan reads it, at a graph break)
    return None if torch.compiler.is_compiling() and active.current() is not None else MERGER.get()


def traced_crops(sizes) -> tuple | None:
    """In a traced forward with a plan: ``(vision plan, rows)`` of a crop-size tensor, ``rows`` its ``(h, w)`` rows as
    Python ints and the vision plan where they are the plan's crops as planned (else None): the call's own
    ``target_sizes`` / ``target_sizes_videos`` (by identity), or a tensor noted as derived from them. None otherwise
    (and always in an eager forward, where the tower and merger are handed the plan's host sizes)."""
    entry = active.current() if torch.compiler.is_compiling() else None
    if entry is None:
        return None
    for vp, name in ((entry.plan.image, "target_sizes"), (entry.plan.video, "target_sizes_videos")):
        if vp is not None and entry.given.get(name) is sizes:
            return vp, tuple((h, w) for _, h, w in vp.rows)
    return entry.known(sizes)


def stream_crops(sizes) -> tuple | None:
    """In a traced forward of a stream (``Layout.stream``): ``(vision plan, host sizes)`` where ``sizes`` is a plan's
    crops (made with host lengths) or a tensor noted as derived from them (``frame_sizes``, ``halved_sizes``, the
    tower's host sizes), ``host sizes`` the same values as a host tensor; else None. Reads none of their rows: a row
    read is a guard, a graph per layout."""
    entry = active.current() if torch.compiler.is_compiling() else None
    if entry is None or not isinstance(sizes, torch.Tensor):
        return None
    for vp, name in ((entry.plan.image, "target_sizes"), (entry.plan.video, "target_sizes_videos")):
        if vp is not None and vp.host_seqlens is not None and entry.given.get(name) is sizes:
            return vp, vp.grid_thw[:, 1:]
    known = entry.known(sizes)  # (a stream's notes hold the host sizes where the rows would be)
    if known is None or known[0] is None or known[0].host_seqlens is None or not isinstance(known[1], torch.Tensor):
        return None
    return known


def note_stream_crops(sizes, vp, host) -> None:
    """Make ``sizes`` known as ``vp``'s crops, ``host`` their values as a host tensor (see ``stream_crops``)."""
    active.current().note(sizes, vp, host)


def halved_sizes(target_sizes):
    """``target_sizes // 2`` (the crops after a 2x2 merge), noted with its rows in a traced forward (in a stream's,
    with its host values)."""
    halved = target_sizes // 2
    stream = stream_crops(target_sizes)
    if stream is not None:
        note_stream_crops(halved, stream[0], stream[1] // 2)
        return halved
    found = traced_crops(target_sizes)
    if found is not None:
        active.current().note(halved, None, tuple((h // 2, w // 2) for h, w in found[1]))
    return halved


def frame_sizes(target_sizes_videos, num_frames: int):
    """``target_sizes_videos.repeat(num_frames, 1)`` (every frame's crops), noted with its rows in a traced forward
    (still the plan's crops where there is one repeat: the forward hands ``pixel_values_videos[:1]``)."""
    repeated = target_sizes_videos.repeat(num_frames, 1)
    stream = stream_crops(target_sizes_videos)
    if stream is not None and num_frames == 1:  # (no rows: a row read is a guard, a graph per layout)
        note_stream_crops(repeated, *stream)
        return repeated
    found = traced_crops(target_sizes_videos)
    if found is not None:
        vp, rows = found
        active.current().note(repeated, vp if num_frames == 1 else None, rows * num_frames)
    return repeated


def crop_size(target_sizes, index: int):
    """``target_sizes[index]``: a crop's ``(h, w)``; Python ints from the plan's rows in a traced forward (stock's
    0-d tensors would be read back by the slicing that follows)."""
    found = traced_crops(target_sizes)
    return target_sizes[index] if found is None else found[1][index]


def _traced_windows(merger, target_sizes) -> tuple | None:
    """In a traced forward: the crops' rows and the window side, where every crop is tiled by whole windows (stock's
    padded windows, and its error for such crops, stay stock's); else None."""
    found = traced_crops(target_sizes)
    side, other = merger.window_kernel_size
    if found is None or side != other or any(h % side or w % side for h, w in found[1]):
        return None
    return found[1], side


def navit_window_index(merger, target_sizes, kwargs):
    """``self.get_window_index(target_sizes, kwargs=kwargs)``: the planned window order and boundaries (on the
    device already: stock's ``.to(device)`` after it is then no copy), else stock's. In a traced forward the order
    is built in the graph from the crops' rows: windows row by row within each crop, each window's patches row by row
    (stock's ``get_vision_window_index`` for a merge and patch of 1, where whole windows tile the crop)."""
    tables = _tables()
    window_h, window_w = merger.window_kernel_size
    if tables is not None:
        return tables.window_index, tables.cu_window_seqlens, window_h * window_w
    traced = _traced_windows(merger, target_sizes)
    if traced is None:
        return merger.get_window_index(target_sizes, kwargs=kwargs)
    order, bounds = window_order(*traced, merger.linear_1.weight.device)
    return order, bounds, window_h * window_w


def window_order(rows, side: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The window merger's patch order and window boundaries for crops of ``(h, w)`` Python ints that ``side x side``
    windows tile: windows row by row within each crop, each window's patches row by row (stock's
    ``get_vision_window_index`` for a merge and patch of 1), made on ``device`` by factories sized by host ints."""
    parts, start = [], 0
    for h, w in rows:
        order = torch.arange(h * w, device=device).view(h // side, side, w // side, side).permute(0, 2, 1, 3)
        parts.append(order.reshape(-1) + start)
        start += h * w
    return torch.cat(parts), torch.arange(0, start + 1, side * side, dtype=torch.int32, device=device)


def navit_window_kwargs(kwargs: dict, merger=None, target_sizes=None) -> dict:
    """What the window attention is handed besides stock's arguments: the window sizes (and the attention backend
    the tower was given), so it splits by host sizes."""
    tables = _tables()
    out = {k: kwargs[k] for k in ("syncfree_attention",) if k in kwargs}
    if tables is not None:
        out["syncfree_seqlens"] = tables.window_seqlens
    elif merger is not None and (traced := _traced_windows(merger, target_sizes)) is not None:
        rows, side = traced
        windows = sum(h * w for h, w in rows) // (side * side)
        out["syncfree_seqlens"] = {windows + 1: (side * side,) * windows}
    return out


def navit_merged_cu_seqlens(kwargs: dict, stock, target_sizes=None, device=None):
    """The segments after the window merger (stock: ``cumsum(target_sizes // 2 ...).to(device)``): the planned
    ones; the layers after the merger get their sizes through ``kwargs`` (what the downsampled call passes on). In a
    traced forward, from the merged crops' rows (``target_sizes`` as ``halved_sizes`` noted it)."""
    tables = _tables()
    if tables is not None:
        kwargs["syncfree_seqlens"] = tables.merged_seqlens
        return tables.merged_cu_seqlens
    stream = stream_crops(target_sizes)
    if stream is not None:
        # (a stream: the merged crops' segments made on the device from the plan's grid there, the lengths the
        # attention's operator takes from the host sizes; no row read)
        vp, host = stream
        cu_seqlens = torch.nn.functional.pad(torch.cumsum(_merged_tokens(vp.device_grid[:, 1], vp.device_grid[:, 2]),
                                                          dim=0, dtype=torch.int32), (1, 0))
        kwargs["syncfree_seqlens"] = TracedSegments(
            [(cu_seqlens, host[:, 0] * host[:, 1],
              lambda: tuple(_merged_tokens(h, w) for _, h, w in vp.rows))], lambda: {})
        return cu_seqlens
    found = traced_crops(target_sizes) if target_sizes is not None else None
    if found is None:
        return stock()
    merged = tuple(h * w for h, w in found[1])
    kwargs["syncfree_seqlens"] = {len(merged) + 1: merged}
    return torch.tensor((0, *itertools.accumulate(merged)), dtype=torch.int32, device=device)
