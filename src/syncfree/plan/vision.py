"""What the vision tower derives from one modality's ``grid_thw``: segment and split sizes planned on the host
(integers per image, frame and window), per-patch tables made on the device (``vision_tables``)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import GridDtypeError, GridError, GridShapeError
from .rope_host import row_runs
from .spec import ModelSpec
from .tensors import DeviceFields, move
from .vision_tables import (
    TowerTables,
    device_tables,
    device_tables_match_stock,
    host_tables,
    item_columns,
    merge_kwargs,
    window_columns,
)

__all__ = ["VisionPlan", "vision_plan"]


@dataclass
class VisionPlan(DeviceFields):
    """What the vision tower derives from one modality's ``grid_thw``: host integers, a few small tensors, and
    the per-patch tables, made on the plan's device when first asked for (``vision_tables``)."""

    grid_thw: torch.Tensor  # (N, 3), on the host
    rows: tuple[tuple[int, int, int], ...]  # the same rows as Python ints (what a traced forward computes stock's sizes from)
    seqlens: tuple[int, ...]  # attention segment lengths: one per frame (h * w patches), or per clip (t * h * w)
    split_sizes: tuple[int, ...]  # features (placeholders) per image or video
    max_seqlen: int
    n_patches: int  # sum of t * h * w
    cu_seqlens: torch.Tensor  # (segments + 1,) int32
    device_grid: torch.Tensor  # (N, 3) int64: the grid rows, moved with the plan (a tower that takes its grid there)
    items: torch.Tensor | None  # (len(ITEM), N) int64: host integers per image or video, moved with the plan; the
    # tables' per-patch values are expanded from it (None: the tower reads no tables, TowerShape.patch_tables=False)
    tower_tables: TowerTables  # what the tables read of the spec
    tables_by_device: bool  # built on the device (the installed stock helpers checked), else stock's on the host
    cu_window_seqlens: torch.Tensor | None = None  # window attention (TowerShape.windows)
    windows: torch.Tensor | None = None  # (len(WINDOW), windows) int64: host integers per window, moved with the plan
    window_seqlens: tuple[int, ...] = ()
    max_window_seqlen: int = 0
    device: str = "cpu"  # where the tensors above live (grid_thw stays on the host)
    # Per-item merge sizes (``TowerShape.item_merge_sizes``): (N,) int64 on the host (``items`` holds them too).
    merge_sizes: torch.Tensor | None = None
    merges: tuple[int, ...] = ()  # the same merge sizes as Python ints
    # Tokens the tower prepends to each attention segment before its blocks (``TowerShape.segment_class_token``: 1), which
    # its attention's split sizes count; ``seqlens`` and ``cu_seqlens`` count patches only, as stock's helpers do.
    segment_prefix: int = 0
    # The per-patch tables made on ``device`` (cached: a plan serves one batch, e.g. every step of generate()).
    tables_made: dict = field(default_factory=dict, compare=False, repr=False)
    # ``seqlens`` (with ``segment_prefix``) and ``window_seqlens`` as host int64 tensors, for a family one graph
    # serves a stream of (``plan.dynamic_dims``, at ``prepare``): what its traced forward hands the vision attention
    # (``rewrite.segments.TracedSegments``), sizes Dynamo keeps dynamic.
    host_seqlens: torch.Tensor | None = field(default=None, compare=False, repr=False)
    host_window_seqlens: torch.Tensor | None = field(default=None, compare=False, repr=False)

    # Whether the features of all items together are the patches over the merge squared (no tokens added, none
    # pooled away): then a traced forward sizes its one piece of features by its pixels (``helpers``).
    features_follow_patches: bool = field(default=False, compare=False, repr=False)
    # ``max_seqlen`` and ``max_window_seqlen`` for a traced forward, as sizes (see ``Plan.carriers``).
    carriers: dict = field(default_factory=dict, compare=False, repr=False)
    # Each item's height and width for a traced forward, as sizes: one (height, width) pair of carriers per item (see
    # ``Plan.carriers``), for a family whose forward loops over its items in Python (``PlanHooks.item_sizes``).
    row_carriers: tuple = field(default=(), compare=False, repr=False)
    # ``split_sizes`` as the host int64 array they were computed as (None where not made so): the plan's later steps
    # take them whole (a NaViT batch has thousands of crops, and a tuple back to an array costs as much again).
    split_array: np.ndarray | None = field(default=None, compare=False, repr=False)


    _TENSORS = ("cu_seqlens", "device_grid", "items", "cu_window_seqlens", "windows")
    # (The per-item and per-window tables travel narrowed: a NaViT batch has thousands of crops, 27 values each.)
    _NARROW = ("items", "windows")

    @property
    def num_patches(self) -> int:
        return self.n_patches

    def to(self, device) -> "VisionPlan":
        return dataclasses.replace(super().to(device), tables_made={})

    def tables(self, patches=None) -> dict:
        """``position_ids`` (patches, 2) rotary (row, col) ids, or (patches, 3) (t, row, col) ones (with
        ``TowerShape.temporal_position_ids``);
        ``interp_indices`` / ``interp_weights`` (patches, taps) into a learned position table (``Layout.table``);
        a windowed tower's ``window_index`` (merged patches,): made on the plan's device from ``device_grid`` (no sync,
        nothing big uploaded), once."""
        if self.tables_made:
            return self.tables_made
        if self.items is None:  # (TowerShape.patch_tables=False: the family's tower was declared to read none)
            raise RuntimeError("syncfree: this vision plan has no item table (its family's TowerShape says the tower "
                               "reads no per-patch tables), but its per-patch tables were asked for")
        if self.tables_by_device:
            # (``patches``: the patch count as the traced forward's pixels give it, a size Dynamo keeps dynamic)
            tables = device_tables(self.items, self.num_patches if patches is None else patches, self.tower_tables,
                                   self.windows)
        else:
            tables = {k: move(v, self.device)
                      for k, v in host_tables(self.grid_thw, self.tower_tables, **merge_kwargs(self.merge_sizes)).items()}
        if not torch.compiler.is_compiling():  # (a graph made with the plan computes them in the graph)
            self.tables_made.update(tables)
        return tables

    position_ids = property(lambda self: self.tables()["position_ids"])
    interp_indices = property(lambda self: self.tables().get("interp_indices"))
    interp_weights = property(lambda self: self.tables().get("interp_weights"))
    window_index = property(lambda self: self.tables().get("window_index"))
    pixel_shuffle_index = property(lambda self: self.tables().get("pixel_shuffle_index"))

    @property
    def has_windows(self) -> bool:
        return self.tower_tables.window_size is not None

    def seqlens_by_length(self) -> dict:
        """Host segment sizes keyed by the length of the cu_seqlens they go with: attention layers find their
        split sizes that way (full and window segmentations; equal lengths mean equal segmentations)."""
        seqlens = {len(self.seqlens) + 1: tuple(s + self.segment_prefix for s in self.seqlens)}
        if self.has_windows:
            seqlens[len(self.window_seqlens) + 1] = self.window_seqlens
        return seqlens

    def seqlen_kwargs(self, traced: bool = False) -> dict:
        """Keyword arguments for a tower whose only stock helper is the attention's ``cu_seqlens`` (e.g.
        no rotary ids, its own position resampling): the per-patch tables are not made at all. ``traced``: for a
        forward Dynamo traces, as in ``vision_kwargs``."""
        if traced and self.host_seqlens is not None:  # (the segment sizes: the caller's, as in vision_kwargs)
            return {"cu_seqlens": self.cu_seqlens, "max_seqlen": self.carriers["max_seqlen"].shape[0]}
        return {"cu_seqlens": self.cu_seqlens, "max_seqlen": self.max_seqlen,
                "syncfree_seqlens": self.seqlens_by_length()}

    def vision_kwargs(self, patches=None, traced: bool = False) -> dict:
        """Keyword arguments for the vision tower: the stock helpers take these instead of computing them.
        ``traced``: for a forward Dynamo traces (the longest segments as sizes, ``carriers``; the segment sizes are
        the caller's, ``rewrite.segments.TracedSegments``); ``patches``: the patch count there, as the pixels give it."""
        tables = self.tables(patches)
        longest = {n: c.shape[0] for n, c in self.carriers.items()} if traced else {}
        kwargs = {"cu_seqlens": self.cu_seqlens, "max_seqlen": longest.get("max_seqlen", self.max_seqlen),
                  "position_ids": tables["position_ids"]}
        if "interp_indices" in tables:
            kwargs.update(interp_indices=tables["interp_indices"], interp_weights=tables["interp_weights"])
        if self.has_windows:
            kwargs.update(window_index=tables["window_index"], cu_window_seqlens=self.cu_window_seqlens,
                          max_window_seqlen=longest.get("max_window_seqlen", self.max_window_seqlen))
        if "pixel_shuffle_index" in tables:  # (a tower that pixel-shuffles after its encoder)
            kwargs["pixel_shuffle_index"] = tables["pixel_shuffle_index"]
        if "frame_index" in tables:  # temporal pooling: the merged-token count is the split sizes' sum (a host integer)
            merged = longest["merged_tokens"] if "merged_tokens" in longest else sum(self.split_sizes)
            kwargs.update(frame_index=tables["frame_index"], temporal_merge_index=(
                tables["merge_destination"], tables["frame_weight"], merged))
        if self.segment_prefix:  # (a class token per frame: stock's get_vision_frame_lengths takes the patch counts)
            stream = traced and self.host_seqlens is not None  # (then as a host tensor, sizes Dynamo keeps dynamic)
            kwargs["frame_lengths"] = self.host_seqlens - self.segment_prefix if stream else list(self.seqlens)
        if not (traced and self.host_seqlens is not None):  # (else the caller's: rewrite.segments.TracedSegments)
            kwargs["syncfree_seqlens"] = self.seqlens_by_length()
        return kwargs


def _cumulative(sizes) -> torch.Tensor:
    """(len + 1,) int32 cumulative sizes from 0, as stock's cu_seqlens (a tuple or an array of sizes; one host op)."""
    return torch.from_numpy(np.concatenate(([0], np.cumsum(sizes, dtype=np.int64))).astype(np.int32))


def vision_plan(grid_thw: torch.Tensor, spec: ModelSpec, name: str = "grid_thw", temporal_merge: int = 1,
                merge_sizes: torch.Tensor | None = None) -> VisionPlan:
    """Build a VisionPlan on the host: integers per image, frame and window (the per-patch tables come later,
    on the device, from the grid rows). ``temporal_merge``: frames merged into one token after the tower (a resampler's
    videos: 2), which divides the split sizes as stock's ``prod(-1) // merge**2 // temporal_merge_size``.
    ``merge_sizes``: a host (N,) tensor of each row's own merge size (``TowerShape.item_merge_sizes``).
    What the tower makes of each row (its segments, its features) is its ``TowerShape``'s to say."""
    grid, rows, runs = _check_grid(grid_thw, spec.spatial_merge_size, name)
    host = grid.numpy()
    tower = spec.tower
    per_item = tower.item_merges(grid, rows, merge_sizes, name)  # (merge_sizes, merges), or None: the spec's merge
    tables = TowerTables.of(spec, item_merges=per_item is not None)
    merge = spec.spatial_merge_size
    extra = {}
    if per_item is not None:
        extra.update(merge_sizes=per_item[0], merges=tuple(per_item[1]))
        merge = np.asarray(per_item[1], dtype=np.int64)
    if tables.window_size is not None:
        table = window_columns(rows, tables)  # (one host table per window: window_seqlens' sizes its first row)
        sizes = table[0].numpy() * tables.merge ** 2
        windows = tuple(sizes.tolist())
        extra.update(cu_window_seqlens=_cumulative(sizes), window_seqlens=windows, max_window_seqlen=max(windows),
                     windows=table)
    # (Sizes per item in NumPy over the grid's columns, then one ``tolist``: a NaViT batch has thousands of crops.)
    t, h, w = host.T
    seqlens, split_sizes = tower.segment_lengths(t, h, w), tower.split_sizes(t, h, w, merge, temporal_merge)
    cu_seqlens = _cumulative(seqlens)
    # (max and sums in NumPy, before the one ``tolist`` each: a NaViT batch has thousands of crops)
    longest, patches, features = int(seqlens.max()), int(seqlens.sum()), int(split_sizes.sum())
    split_array = split_sizes.astype(np.int64)
    split_array.setflags(write=False)
    seqlens, split_sizes = tuple(seqlens.tolist()), tuple(split_sizes.tolist())
    return VisionPlan(
        grid_thw=grid, rows=rows, seqlens=seqlens, split_sizes=split_sizes, split_array=split_array,
        max_seqlen=longest, n_patches=patches, cu_seqlens=cu_seqlens, device_grid=grid,
        features_follow_patches=per_item is None and tower.features_follow_patches(features, patches, merge),
        items=item_columns(host, tables, per_item and per_item[1], runs=runs) if tower.patch_tables else None,
        tower_tables=tables,
        tables_by_device=device_tables_match_stock(tables), segment_prefix=tower.segment_prefix, **extra,
    )


def _check_grid(grid, merge: int, name: str) -> tuple[torch.Tensor, tuple, np.ndarray | None]:
    """The grid as int64 on the host, its rows as Python ints (checked there: a few integers), and where its runs
    of equal rows start (None for a grid of 64 rows or fewer, which is looked at row by row)."""
    if not isinstance(grid, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of shape (N, 3), got {type(grid).__name__}")
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.shape[0] == 0:
        raise GridShapeError(f"{name} must have shape (N, 3) with N >= 1, got {tuple(grid.shape)}")
    if grid.dtype.is_floating_point or grid.dtype == torch.bool or grid.is_complex():
        raise GridDtypeError(f"{name} must hold integers (torch.long), got {grid.dtype}")
    grid = grid.to("cpu", torch.long)
    values = grid.numpy()  # (checked in NumPy, whole columns: a NaViT batch has thousands of rows)
    # (A NaViT batch has thousands of crops of a few sizes side by side: found once, the runs of equal rows serve
    # the checks, the rows' tuples and the item table; a run's first row speaks for the run.)
    runs = row_runs(values) if values.shape[0] > 64 else None
    firsts = values if runs is None else values[runs]
    if (firsts <= 0).any():
        raise GridError(f"{name} must be positive everywhere, got {grid.tolist()}")
    if (firsts[:, 1:] % merge).any():
        raise GridError(f"{name} heights and widths must be multiples of spatial_merge_size={merge}, "
                        f"got {grid.tolist()}")
    return grid, _rows_of(values, runs), runs


def _rows_of(values: np.ndarray, runs: np.ndarray | None) -> tuple:
    """The grid's rows as a tuple of ``(t, h, w)`` tuples of Python ints, one tuple object per run of equal rows
    (``runs``: where they start; None: a tuple per row): a tuple per row of a NaViT batch's thousands of crops was a
    good part of its plan's host time."""
    if runs is None:
        return tuple(map(tuple, values.tolist()))
    counts = np.diff(np.append(runs, values.shape[0])).tolist()
    repeated = [(tuple(row),) * n for row, n in zip(values[runs].tolist(), counts)]
    return tuple(itertools.chain.from_iterable(repeated))
