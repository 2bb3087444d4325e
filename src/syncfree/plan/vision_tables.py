"""The vision tower's per-patch tables, built where the patches are, from the plan's host integers (no sync).

Stock derives four tables from ``grid_thw`` in every vision forward: the rotary (row, col) id of each
patch (``get_vision_position_ids``), the learned position table's interpolation taps and weights
(``get_vision_interpolation_indices_and_weights``, Qwen3-VL) and the window permutation
(``get_vision_window_index``, Qwen2.5-VL). They grow with the patches (125k patches: 8 MB), so making them
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

import torch

__all__ = ["TableSpec", "device_tables", "host_tables", "window_seqlens", "device_tables_match_stock", "merge_kwargs"]


@functools.lru_cache(maxsize=None)
def _module(name: str):
    # (not importlib.import_module: a compiled vision tower traces this, and Dynamo traces a dict lookup)
    return sys.modules.get(name) or __import__(name, fromlist=["_"])


class TableSpec(NamedTuple):
    """What the tables need from the model (hashable: the stock check is made once per spec; picklable: plans
    travel from DataLoader workers)."""

    module: str  # the modeling module whose stock helpers these tables stand for
    merge: int
    side: int | None  # learned position table side (Qwen3-VL), else None
    window: int | None  # window size in pixels (Qwen2.5-VL), else None
    patch: int
    align_corners: bool = True  # how the learned table is resampled (False: PaddleOCR-VL)
    # Each grid row has its own merge size, handed with the grid (VideoLLaMA3: images 1, videos 2); ``merge`` is then 1
    # and the tables take the rows' merges (``merges=``).
    item_merges: bool = False
    # Rotary ids with a leading frame column, (t, row, col) per patch: stock's ``include_temporal=True``
    # (MiniMax-M3-VL's tower rotates the temporal axis too); False: (row, col), repeated for each frame.
    temporal: bool = False
    # Muse Glimmer / Spark: the learned table is read at (w, h) (stock's helper takes ``grid_thw[:, [0, 2, 1]]``) with
    # out-of-range taps weighted zero (``padding="zeros"``); ``shuffle``: the tower's pixel-shuffle factor after its
    # encoder (``get_vision_pixel_shuffle_index``), 0 where there is none.
    swap_hw: bool = False
    padding: str = "border"
    shuffle: int = 0
    # How the learned table is resampled: stock's interpolation mode ("bicubic": Kimi-K2.5's 16 taps).
    mode: str = "bilinear"
    # Kimi-K2.5's tower: each patch's index into its frame-embedding table (``get_vision_frame_index``) and the
    # temporal pooling after its encoder (``get_vision_temporal_merge_index``) by this (height, width) kernel.
    pool: tuple[int, int] | None = None


def window_seqlens(rows, spec: TableSpec) -> list[int]:
    """Patches per attention window, in stock's order (frames, window rows, window columns), empty windows
    dropped as stock's ``unique_consecutive`` drops them. Host integers: one per window."""
    merge, unit = spec.merge, spec.merge ** 2
    size = spec.window // merge // spec.patch  # window side in merged patches
    sizes = []
    for t, h, w in rows:
        lh, lw = h // merge, w // merge
        heights = [min(size, lh - r) for r in range(0, lh, size)]
        widths = [min(size, lw - c) for c in range(0, lw, size)]
        frame = [a * b * unit for a in heights for b in widths]
        sizes.extend(frame * t)
    return sizes


def _spread(grids: torch.Tensor, total: int) -> tuple[torch.Tensor, ...]:
    """For each of ``total`` items laid out grid after grid (``t * h * w`` each): its grid's h and w, its index
    inside its grid and where its grid starts. Each item's grid comes from ``repeat_interleave`` with the
    host-known total (no sync)."""
    counts = grids[:, 0] * grids[:, 1] * grids[:, 2]
    which = torch.repeat_interleave(counts, output_size=total)
    start = (counts.cumsum(0) - counts).index_select(0, which)
    local = torch.arange(total, device=grids.device) - start
    return grids[:, 1].index_select(0, which), grids[:, 2].index_select(0, which), local, start


def _decode(grids: torch.Tensor, total: int, merge: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each patch's (row, col) in its frame, in stock's spatial-merge-block order, and its image's (h, w)."""
    heights, widths, local, _ = _spread(grids, total)
    within = local % (heights * widths)  # place in its frame
    blocks_w = widths // merge
    in_col, in_row = within % merge, (within // merge) % merge
    block_col, block_row = (within // (merge * merge)) % blocks_w, within // (merge * merge * blocks_w)
    return block_row * merge + in_row, block_col * merge + in_col, heights, widths


def _frames(grids: torch.Tensor, total: int) -> torch.Tensor:
    """Each patch's frame in its image or video (stock's ``arange(t).repeat_interleave(h * w)``)."""
    heights, widths, local, _ = _spread(grids, total)
    return local // (heights * widths)


def _pooling(grids: torch.Tensor, total: int, kernel: tuple[int, int]) -> dict:
    """Kimi-K2.5's frame index (0 for a one-frame clip, else frame + 1) and its temporal pooling's destination
    (merged token * kernel + place in the kernel, frames of a clip onto the same token) and weight (1 / frames),
    stock's arithmetic on each patch's raster (row, col). The merged-token count is the plan's host integer."""
    kh, kw = kernel
    heights, widths, local, _ = _spread(grids, total)
    which = torch.repeat_interleave(grids[:, 0] * grids[:, 1] * grids[:, 2], output_size=total)
    frames = grids[:, 0].index_select(0, which)
    within = local % (heights * widths)
    row, col = within // widths, within % widths
    merged = (grids[:, 1] // kh) * (grids[:, 2] // kw)
    offset = (merged.cumsum(0) - merged).index_select(0, which)
    destination = (offset + (row // kh) * (widths // kw) + col // kw) * (kh * kw) + (row % kh) * kw + col % kw
    return {"frame_index": local // (heights * widths) + (frames > 1),
            "merge_destination": destination, "frame_weight": 1.0 / frames.to(torch.float32)}


def _window_index(grids: torch.Tensor, merged: int, spec: TableSpec) -> torch.Tensor:
    """Stock's window permutation: for each place in window order, the merged patch that goes there.

    A merged patch at (frame, r, c) of an (lh, lw) grid lands after the frames before it, the full window
    rows above it (``size * lw`` each), the windows to its left in its window row (``size`` columns of that
    row's height each) and the rows above it in its own window (that window's width each)."""
    merge, size = spec.merge, spec.window // spec.merge // spec.patch
    small = torch.stack([grids[:, 0], grids[:, 1] // merge, grids[:, 2] // merge], 1)
    lh, lw, local, start = _spread(small, merged)
    frame, r, c = local // (lh * lw), (local // lw) % lh, local % lw
    window_h = torch.clamp(lh - (r // size) * size, max=size)
    window_w = torch.clamp(lw - (c // size) * size, max=size)
    place = (start + frame * lh * lw + (r // size) * size * lw + (c // size) * size * window_h
             + (r % size) * window_w + c % size)
    source = torch.arange(merged, device=grids.device)
    return torch.empty_like(source).index_copy_(0, place, source)


def _patch_merges(grids: torch.Tensor, merges: torch.Tensor, total: int) -> torch.Tensor:
    """Each patch's merge size (``spec.item_merges``): its grid row's, spread with the host-known total (no sync)."""
    return torch.repeat_interleave(merges, grids[:, 0] * grids[:, 1] * grids[:, 2], output_size=total)


def merge_kwargs(merges: torch.Tensor | None) -> dict:
    """``merges=`` for ``device_tables`` / ``host_tables`` where there are per-row merges, else nothing."""
    return {} if merges is None else {"merges": merges}


def device_tables(grids: torch.Tensor, total: int, spec: TableSpec, merges: torch.Tensor | None = None) -> dict:
    """The per-patch tables on ``grids.device`` (``grids``: the (N, 3) int64 grid rows, already there; ``merges``:
    the (N,) int64 merge size of each row, there too, where ``spec.item_merges``)."""
    merge = _patch_merges(grids, merges, total) if spec.item_merges else spec.merge  # (the decoding is elementwise)
    row, col, heights, widths = _decode(grids, total, merge)
    tables = {"position_ids": torch.stack([row, col], -1)}
    if spec.temporal:
        tables["position_ids"] = torch.stack([_frames(grids, total), row, col], -1)
    if spec.side is not None:
        helper = _module(spec.module).get_vision_interpolation_indices_and_weights
        kernel = _module(helper.__module__)  # where stock's per-axis kernel lives
        # (the swapped grid by stacking its columns: a list index of a device tensor would copy the list over)
        at, side = (_decode(torch.stack([grids[:, 0], grids[:, 2], grids[:, 1]], 1), total, merge) if spec.swap_hw
                    else (row, col, heights, widths)), spec.side
        options = {"padding": spec.padding} if spec.padding != "border" else {}  # (older kernels take no padding)
        h_taps, h_weights = kernel._interpolation_axis_taps_weights(at[0], at[2], side, spec.mode, spec.align_corners,
                                                                    **options)
        w_taps, w_weights = kernel._interpolation_axis_taps_weights(at[1], at[3], side, spec.mode, spec.align_corners,
                                                                    **options)
        n = h_taps.shape[1]
        tables["interp_indices"] = (h_taps[:, :, None] * spec.side + w_taps[:, None, :]).reshape(-1, n * n)
        tables["interp_weights"] = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
    if spec.window is not None:
        tables["window_index"] = _window_index(grids, total // spec.merge ** 2, spec)
    if spec.shuffle:
        tables["pixel_shuffle_index"] = _shuffle_index(grids, total, spec.shuffle)
    if spec.pool is not None:
        tables.update(_pooling(grids, total, spec.pool))
    return tables


def _shuffle_index(grids: torch.Tensor, total: int, factor: int) -> torch.Tensor:
    """Stock's pixel-shuffle gather index: output place p (in ``factor x factor`` block order within its frame) takes
    the raster patch at that block place's (row, col) of the same frame."""
    row, col, heights, widths = _decode(grids, total, factor)
    _, _, local, start = _spread(grids, total)
    frame_start = start + local - local % (heights * widths)
    return frame_start + row * widths + col


def host_tables(grid_thw: torch.Tensor, spec: TableSpec, merges: torch.Tensor | None = None) -> dict:
    """The same tables from the installed stock helpers, on the host (the fallback, and the reference)."""
    module = _module(spec.module)
    # (A tower without rotary ids, Cosmos3-Edge's, imports no such helper; its plan never hands the ids over.)
    position_ids = (getattr(module, "get_vision_position_ids", None)
                    or _module("transformers.vision_utils").get_vision_position_ids)
    merge = merges if spec.item_merges else spec.merge
    tables = {"position_ids": (position_ids(grid_thw, merge, include_temporal=True) if spec.temporal
                               else position_ids(grid_thw, merge))}
    if spec.side is not None:
        options = {"padding": spec.padding} if spec.padding != "border" else {}
        tables["interp_indices"], tables["interp_weights"] = module.get_vision_interpolation_indices_and_weights(
            grid_thw[:, [0, 2, 1]] if spec.swap_hw else grid_thw, num_grid_per_side=spec.side, mode=spec.mode,
            align_corners=spec.align_corners, spatial_merge_size=spec.merge, **options)
    if spec.window is not None:
        tables["window_index"] = module.get_vision_window_index(
            grid_thw, spatial_merge_size=spec.merge, window_size=spec.window, patch_size=spec.patch)[0]
    if spec.shuffle:
        tables["pixel_shuffle_index"] = module.get_vision_pixel_shuffle_index(grid_thw, spec.shuffle)
    if spec.pool is not None:
        tables["frame_index"] = module.get_vision_frame_index(grid_thw)
        tables["merge_destination"], tables["frame_weight"], _ = module.get_vision_temporal_merge_index(
            grid_thw, *spec.pool)
    return tables


def _probe_grids(spec: TableSpec) -> torch.Tensor:
    """Grids that reach every branch: one block, non-square, a video, window grids that do and do not divide."""
    m = max(spec.merge, spec.shuffle)  # (a pixel shuffle needs sides that its factor divides)
    size = (spec.window // m // spec.patch) if spec.window else 2
    rows = [(1, m, m), (2, 2 * m, 3 * m), (1, 3 * m, m), (3, (2 * size + 1) * m, (size + 2) * m),
            (1, 2 * size * m, size * m), (2, (size + 1) * m, (size - 1 or 1) * m)]
    return torch.tensor(rows, dtype=torch.long)


def _probe_merges(grids: torch.Tensor, spec: TableSpec) -> torch.Tensor | None:
    """Per-row merges for the probe grids (``spec.item_merges``): 1 and 2 in turn, on grids doubled to divide."""
    if not spec.item_merges:
        return None
    grids[:, 1:] *= 2
    return torch.tensor([1 + i % 2 for i in range(grids.shape[0])], dtype=torch.long)


@functools.lru_cache(maxsize=None)
def device_tables_match_stock(spec: TableSpec) -> bool:
    """Whether ``device_tables`` equals the installed stock helpers (checked once on the host, per spec)."""
    grids = _probe_grids(spec)
    merges = _probe_merges(grids, spec)
    try:
        # (the merges passed only where the spec takes them: every other spec's call stays as it was)
        ours = device_tables(grids, int(grids.prod(-1).sum()), spec, **merge_kwargs(merges))
    except AttributeError:  # a release without the helpers this builds on
        ours = None
    stock = host_tables(grids, spec, **merge_kwargs(merges))
    same = ours is not None and all(torch.equal(ours[k], v) for k, v in stock.items())
    if not same:
        warnings.warn(f"syncfree: the installed Transformers' vision helpers in {spec.module} differ from the "
                      "ones syncfree builds on the device; their tables are made on the host and copied with the "
                      "batch instead (correct, no sync, more host time and upload per batch)", stacklevel=2)
    return same
