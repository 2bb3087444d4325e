"""The vision tower's per-patch tables, built where the patches are, from the plan's host integers (no sync).

Stock derives four tables from ``grid_thw`` in every vision forward: the rotary (row, col) id of each
patch (``get_vision_position_ids``), the learned position table's interpolation taps and weights
(``get_vision_interpolation_indices_and_weights``) and the window permutation of a tower with window
attention (``get_vision_window_index``). They grow with the patches (125k patches: 8 MB), so making them
on the host and uploading them would cost more host time than the syncs they save. Here they are made on
the tensors' device by a few whole-tensor ops whose shapes come from host integers (the total patch count:
``arange``, ``repeat_interleave(..., output_size=)``), from the grid rows uploaded with the plan (a few
integers per image or video): no read, no wait, no large copy.

The values are stock's: the same integer decoding of each patch's place in its image, and stock's own
per-axis interpolation kernel (``_interpolation_axis_taps_weights``). ``device_tables_match_stock`` checks
that on the host once per process and configuration against the installed stock helpers on a set of grids
that exercises every branch; where they differ (a Transformers release that changed the helpers), the
plan falls back to running the stock helpers on the host and moving their tables (slower, still no sync).
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import NamedTuple

import numpy as np
import torch

from .rope_host import row_runs
from .traits import PositionTable, TowerShape

__all__ = ["TowerTables", "device_tables", "host_tables", "window_seqlens", "device_tables_match_stock", "merge_kwargs",
           "item_columns", "window_columns", "tables_from_grid", "ITEM", "DECODINGS", "WINDOW"]


def _module(name: str):
    # (not importlib.import_module: a compiled vision tower traces this, and Dynamo traces a dict lookup)
    return sys.modules.get(name) or __import__(name, fromlist=["_"])


class TowerTables(NamedTuple):
    """What the tables read of a ``ModelSpec``: its values and traits under their own names, and the merge the tower's
    own helpers take (hashable: the stock check is made once per configuration; picklable: plans travel from DataLoader
    workers)."""

    vision_module: str  # the modeling module whose stock helpers these tables stand for
    # The tower's own merge: ``TowerShape.encoder_merge`` where it merges only after its encoder, else the spec's
    # ``spatial_merge_size`` (1 where the merges come per item: the tables take the rows' own, ``merges=``).
    merge: int
    num_grid_per_side: int | None  # learned position table side (Layout.table), else None
    window_size: int | None  # window size in pixels (TowerShape.windows), else None
    patch_size: int
    align_corners: bool = True  # how the learned table is resampled (stock's align_corners)
    # How the learned table is read and resampled (its interpolation mode, (w, h), padding).
    table: PositionTable = PositionTable()
    # The tower's rotary ids (``temporal_position_ids``: a leading frame column, stock's ``include_temporal=True``).
    tower: TowerShape = TowerShape()
    # The tower's pixel-shuffle factor after its encoder (``get_vision_pixel_shuffle_index``), 0 where there is none.
    pixel_shuffle: int = 0
    # A tower that pools a clip's frames: each patch's index into its frame-embedding table (``get_vision_frame_index``)
    # and the temporal pooling after its encoder (``get_vision_temporal_merge_index``) by this (height, width) kernel.
    temporal_pooling: tuple[int, int] | None = None
    # Each grid row has its own merge size, handed with the grid (``TowerShape.item_merge_sizes``, where the forward
    # is handed them): the tables take the rows' merges (``merges=``).
    item_merges: bool = False

    @classmethod
    def of(cls, spec, item_merges: bool = False) -> "TowerTables":
        """The tables' part of ``spec`` (a ``ModelSpec``)."""
        tower = spec.tower
        return cls(spec.vision_module, tower.encoder_merge or spec.spatial_merge_size, spec.num_grid_per_side,
                   spec.window_size, spec.patch_size, spec.align_corners, spec.table or _NO_TABLE, tower,
                   spec.pixel_shuffle, spec.temporal_pooling, item_merges)


_NO_TABLE = PositionTable()  # (where the tower has no learned table: its values go unused)


@functools.lru_cache(maxsize=256)
def _item_windows(t: int, lh: int, lw: int, size: int) -> np.ndarray:
    """The (4, windows) host table of one image or video of ``t`` frames of ``lh`` x ``lw`` merged patches, in stock's
    order (frames, window rows, window columns; stock's windows are never empty): merged patches per window, top-left
    merged patch (raster order, from the item's start), width, frame width. Cached: a stream repeats its sizes."""
    r, c = np.arange(0, lh, size), np.arange(0, lw, size)
    heights, widths = np.minimum(size, lh - r), np.minimum(size, lw - c)
    per_frame = np.stack([np.outer(heights, widths).ravel(),  # (window rows x window columns, row-major)
                          (r[:, None] * lw + c[None, :]).ravel(),
                          np.broadcast_to(widths, (len(r), len(c))).ravel(),
                          np.full(len(r) * len(c), lw)])
    table = np.tile(per_frame, t)
    table[1] += np.repeat(np.arange(t) * (lh * lw), len(r) * len(c))
    table.setflags(write=False)
    return table


def _windows(rows, spec: TowerTables) -> np.ndarray:
    """Every attention window of the grid ``rows`` in stock's order: a (len(WINDOW), windows) int64 host table (one
    cached table per item size, then offsets: host work that grows with the items, not the windows)."""
    merge = spec.merge
    size = spec.window_size // merge // spec.patch_size  # window side in merged patches
    parts = [_item_windows(t, h // merge, w // merge, size) for t, h, w in rows]
    starts = np.cumsum([0] + [t * (h // merge) * (w // merge) for t, h, w in rows[:-1]])
    sizes, source, width, stride = np.concatenate(parts, axis=1)
    source = source + np.repeat(starts, [p.shape[1] for p in parts])
    place = np.cumsum(sizes) - sizes  # each window's place in window order: the sizes before it
    return np.stack([sizes, place, source, width, stride])


def window_seqlens(rows, spec: TowerTables) -> list[int]:
    """Patches per attention window, in stock's order (``_windows``)."""
    return (_windows(rows, spec)[0] * spec.merge ** 2).tolist()


# The columns of ``item_columns``' table: one row per column, one column per image or video (an (C, N) int64 tensor:
# each row is contiguous, so a patch's values are one ``index_select`` of the table). Host integers per item, so
# the device expands them with a handful of whole-tensor ops instead of deriving them there.
ITEM = ("count",  # t * h * w: the item's patches
        "start",  # where its patches start
        "frames", "height", "width",  # t, h, w
        "frame",  # h * w: patches per frame
        "merge",  # its merge size (spec.merge, or the item's own with spec.item_merges)
        "pool_start", "pool_w")  # temporal pooling: where its merged tokens start, and w // kernel width
# Then three decodings of a patch's place in its frame into (row, col), each six rows (``_decode``): by the merge
# blocks, by the merge blocks of the transposed frame (a table read at (w, h)), and by the pixel shuffle's blocks.
DECODINGS = ("merge", "transposed", "shuffle")
_I = {name: i for i, name in enumerate(ITEM)}
_D = {name: len(ITEM) + 6 * i for i, name in enumerate(DECODINGS)}


def _decoding_columns(m: np.ndarray, across: np.ndarray, frame: np.ndarray) -> tuple[np.ndarray, ...]:
    """``_decode``'s six rows for ``m`` x ``m`` blocks, ``across`` blocks per row, ``frame`` patches per frame (one
    value per item): divisors and moduli of (block row, block col), then divisors of (row in block, col in block)."""
    return (m * m * across, m * m, frame, np.maximum(across, 1), m, np.ones_like(m))


# The columns of ``window_columns``' table (a tower's window attention): one column per window, in stock's order.
WINDOW = ("size",  # merged patches in the window
          "place",  # where its patches start in window order
          "source",  # the merged patch at its top left, in the tower's (raster) order
          "width", "stride")  # its width and its frame's width, in merged patches
_W = {name: i for i, name in enumerate(WINDOW)}


def item_columns(rows, spec: TowerTables, merges=None, runs: np.ndarray | None = None) -> torch.Tensor:
    """The (len(ITEM), N) int64 host table of the grid ``rows`` (``merges``: each row's own merge size; ``runs``:
    where the grid's runs of equal rows start, where the caller found them).

    Whole-column NumPy arithmetic, not a Python tuple per item: a NaViT batch has thousands of crops, and
    the per-item loop was most of its plan's host time."""
    grid = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    merge = np.asarray(merges, dtype=np.int64) if merges is not None else np.full(grid.shape[0], spec.merge)
    n = grid.shape[0]
    # (Computed once per run of equal rows, then repeated: a NaViT image's crops are mostly one size, side by side.)
    if runs is not None and merges is None:  # (one merge size: the grid's runs are the keys')
        starts, keys = runs, np.concatenate([grid[runs], merge[runs, None]], 1)
    else:
        keys = np.concatenate([grid, merge[:, None]], 1)
        starts = row_runs(keys) if n > 64 else None
        keys = keys if starts is None else keys[starts]
    t, h, w, merge = keys.T
    kh, kw = spec.temporal_pooling or (1, 1)
    shuffle = spec.pixel_shuffle or 1
    count, frame = t * h * w, h * w
    pooled = (h // kh) * (w // kw)
    table = np.stack([
        count, count, t, h, w, frame, merge, pooled, w // kw,
        *_decoding_columns(merge, w // merge, frame), *_decoding_columns(merge, h // merge, frame),
        *_decoding_columns(np.full_like(t, shuffle), w // shuffle, frame)])
    if starts is not None:
        table = np.repeat(table, np.diff(np.append(starts, n)), axis=1)
    for column in (_I["start"], _I["pool_start"]):  # (where each item's patches and pooled tokens start)
        table[column] = np.cumsum(table[column]) - table[column]
    return torch.from_numpy(table)


def window_columns(rows, spec: TowerTables) -> torch.Tensor:
    """The (len(WINDOW), windows) int64 host table of the grid ``rows``' attention windows (``_windows``)."""
    return torch.from_numpy(_windows(rows, spec))


def _spread(table: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of ``total`` patches laid out item after item: its item's column of ``table`` (rows ``ITEM``) and its
    index inside its item. The item of each patch comes from ``repeat_interleave`` with the host-known total (no
    sync); four ops in all."""
    which = torch.repeat_interleave(table[_I["count"]], output_size=total)
    per = table.index_select(1, which)
    return per, torch.arange(total, device=table.device) - per[_I["start"]]


def _decode(per: torch.Tensor, local: torch.Tensor, merge, decoding: str) -> torch.Tensor:
    """Each patch's (row, col) in its frame, in stock's block order (``merge`` x ``merge`` blocks laid out row after
    row): a (2, patches) tensor. Both coordinates at once, from pairs of the item's rows (``_decoding_columns``): the
    block's (row, col) is (place // (m*m*across), place // (m*m) % across), the place in the block (place // m % m,
    place % m); seven ops in all."""
    d = _D[decoding]
    within = (local % per[_I["frame"]]).unsqueeze(0)  # place in its frame
    block = within // per[d:d + 2] % per[d + 2:d + 4]
    return block * merge + within // per[d + 4:d + 6] % merge


def _window_index(windows: torch.Tensor, merged: int) -> torch.Tensor:
    """Stock's window permutation: for each place in window order, the merged patch that goes there: the window's top
    left patch, plus the place's row in the window times its frame's width, plus its column."""
    which = torch.repeat_interleave(windows[_W["size"]], output_size=merged)
    per = windows.index_select(1, which)
    local = torch.arange(merged, device=windows.device) - per[_W["place"]]
    width = per[_W["width"]]
    return per[_W["source"]] + (local // width) * per[_W["stride"]] + local % width


def device_tables(items: torch.Tensor, total: int, spec: TowerTables, windows: torch.Tensor | None = None) -> dict:
    """The per-patch tables on ``items.device`` (``items``: ``item_columns``' table, already there; ``windows``:
    ``window_columns``' table, there too, where ``spec.window_size``)."""
    per, local = _spread(items, total)
    merge = per[_I["merge"]] if spec.item_merges else spec.merge  # (the decoding is elementwise)
    places = _decode(per, local, merge, "merge")
    row, col = places
    heights, widths = per[_I["height"]], per[_I["width"]]
    tables = {"position_ids": places.t()}
    if spec.tower.temporal_position_ids:
        tables["position_ids"] = torch.stack([local // per[_I["frame"]], row, col], -1)
    if spec.num_grid_per_side is not None:
        helper = _module(spec.vision_module).get_vision_interpolation_indices_and_weights
        kernel = _module(helper.__module__)  # where stock's per-axis kernel lives
        # (read at (w, h): each patch decoded as if its frame were transposed)
        at = ((*_decode(per, local, merge, "transposed"), widths, heights) if spec.table.swap_hw
              else (row, col, heights, widths))
        table, side = spec.table, spec.num_grid_per_side
        options = {"padding": table.padding} if table.padding != "border" else {}  # (older kernels take no padding)
        h_taps, h_weights = kernel._interpolation_axis_taps_weights(at[0], at[2], side, table.mode,
                                                                    spec.align_corners, **options)
        w_taps, w_weights = kernel._interpolation_axis_taps_weights(at[1], at[3], side, table.mode,
                                                                    spec.align_corners, **options)
        n = h_taps.shape[1]
        tables["interp_indices"] = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, n * n)
        tables["interp_weights"] = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
    if spec.window_size is not None:
        tables["window_index"] = _window_index(windows, total // spec.merge ** 2)
    if spec.pixel_shuffle:
        tables["pixel_shuffle_index"] = _shuffle_index(per, local, spec.pixel_shuffle)
    if spec.temporal_pooling is not None:
        tables.update(_pooling(per, local, spec.temporal_pooling))
    return tables


def _pooling(per: torch.Tensor, local: torch.Tensor, kernel: tuple[int, int]) -> dict:
    """A pooling tower's frame index (0 for a one-frame clip, else frame + 1) and its temporal pooling's destination
    (merged token * kernel + place in the kernel, frames of a clip onto the same token) and weight (1 / frames),
    stock's arithmetic on each patch's raster (row, col). The merged-token count is the plan's host integer."""
    kh, kw = kernel
    frames, frame, widths = per[_I["frames"]], per[_I["frame"]], per[_I["width"]]
    within = local % frame
    row, col = within // widths, within % widths
    destination = ((per[_I["pool_start"]] + (row // kh) * per[_I["pool_w"]] + col // kw) * (kh * kw)
                   + (row % kh) * kw + col % kw)
    return {"frame_index": local // frame + (frames > 1),
            "merge_destination": destination, "frame_weight": 1.0 / frames.to(torch.float32)}


def _shuffle_index(per: torch.Tensor, local: torch.Tensor, factor: int) -> torch.Tensor:
    """Stock's pixel-shuffle gather index: output place p (in ``factor x factor`` block order within its frame) takes
    the raster patch at that block place's (row, col) of the same frame."""
    frame = per[_I["frame"]]
    row, col = _decode(per, local, factor, "shuffle")
    return per[_I["start"]] + local - local % frame + row * per[_I["width"]] + col


def tables_from_grid(grid: torch.Tensor, spec: TowerTables, merges: torch.Tensor | None = None) -> dict:
    """``device_tables`` of the (N, 3) ``grid`` (``merges``: its rows' own merge sizes), on ``grid.device``: the
    columns made on the host from its rows, then moved there (a reference and test entry; plans hold the columns)."""
    rows = grid.tolist()
    items = item_columns(rows, spec, None if merges is None else merges.tolist()).to(grid.device)
    windows = window_columns(rows, spec).to(grid.device) if spec.window_size else None
    return device_tables(items, sum(t * h * w for t, h, w in rows), spec, windows)


def merge_kwargs(merges: torch.Tensor | None) -> dict:
    """``merges=`` for ``host_tables`` where there are per-row merges, else nothing."""
    return {} if merges is None else {"merges": merges}


def host_tables(grid_thw: torch.Tensor, spec: TowerTables, merges: torch.Tensor | None = None) -> dict:
    """The same tables from the installed stock helpers, on the host (the fallback, and the reference)."""
    module = _module(spec.vision_module)
    # (A tower without rotary ids imports no such helper; its plan never hands the ids over.)
    position_ids = (getattr(module, "get_vision_position_ids", None)
                    or _module("transformers.vision_utils").get_vision_position_ids)
    merge = merges if spec.item_merges else spec.merge
    tables = {"position_ids": (position_ids(grid_thw, merge, include_temporal=True) if spec.tower.temporal_position_ids
                               else position_ids(grid_thw, merge))}
    if spec.num_grid_per_side is not None:
        table = spec.table
        options = {"padding": table.padding} if table.padding != "border" else {}
        tables["interp_indices"], tables["interp_weights"] = module.get_vision_interpolation_indices_and_weights(
            grid_thw[:, [0, 2, 1]] if table.swap_hw else grid_thw, num_grid_per_side=spec.num_grid_per_side,
            mode=table.mode,
            align_corners=spec.align_corners, spatial_merge_size=spec.merge, **options)
    if spec.window_size is not None:
        tables["window_index"] = module.get_vision_window_index(
            grid_thw, spatial_merge_size=spec.merge, window_size=spec.window_size, patch_size=spec.patch_size)[0]
    if spec.pixel_shuffle:
        tables["pixel_shuffle_index"] = module.get_vision_pixel_shuffle_index(grid_thw, spec.pixel_shuffle)
    if spec.temporal_pooling is not None:
        tables["frame_index"] = module.get_vision_frame_index(grid_thw)
        tables["merge_destination"], tables["frame_weight"], _ = module.get_vision_temporal_merge_index(
            grid_thw, *spec.temporal_pooling)
    return tables


def _probe_grids(spec: TowerTables) -> torch.Tensor:
    """Grids that reach every branch: one block, non-square, a video, window grids that do and do not divide."""
    m = max(spec.merge, spec.pixel_shuffle)  # (a pixel shuffle needs sides that its factor divides)
    size = (spec.window_size // m // spec.patch_size) if spec.window_size else 2
    rows = [(1, m, m), (2, 2 * m, 3 * m), (1, 3 * m, m), (3, (2 * size + 1) * m, (size + 2) * m),
            (1, 2 * size * m, size * m), (2, (size + 1) * m, (size - 1 or 1) * m)]
    return torch.tensor(rows, dtype=torch.long)


def _probe_merges(grids: torch.Tensor, spec: TowerTables) -> torch.Tensor | None:
    """Per-row merges for the probe grids (``spec.item_merges``): 1 and 2 in turn, on grids doubled to divide."""
    if not spec.item_merges:
        return None
    grids[:, 1:] *= 2
    return torch.tensor([1 + i % 2 for i in range(grids.shape[0])], dtype=torch.long)


@functools.lru_cache(maxsize=None)
def device_tables_match_stock(spec: TowerTables) -> bool:
    """Whether ``device_tables`` equals the installed stock helpers (checked once on the host, per configuration)."""
    grids = _probe_grids(spec)
    merges = _probe_merges(grids, spec)
    try:
        # (the merges passed only where the spec takes them: every other spec's call stays as it was)
        ours = tables_from_grid(grids, spec, merges)
    except AttributeError:  # a release without the helpers this builds on
        ours = None
    stock = host_tables(grids, spec, **merge_kwargs(merges))
    same = ours is not None and all(torch.equal(ours[k], v) for k, v in stock.items())
    if not same:
        warnings.warn(f"syncfree: the installed Transformers' vision helpers in {spec.vision_module} differ from the "
                      "ones syncfree builds on the device; their tables are made on the host and copied with the "
                      "batch instead (correct, no sync, more host time and upload per batch)", stacklevel=2)
    return same
