"""What the vision tower derives from one modality's ``grid_thw``: segment and split sizes planned on the host
(integers per image, frame and window), per-patch tables made on the device (``vision_tables``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import GridDtypeError, GridError, GridShapeError
from .spec import ModelSpec
from .tensors import DeviceFields, move
from .vision_tables import (
    TableSpec,
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
    items: torch.Tensor  # (len(ITEM), N) int64: host integers per image or video, moved with the plan; the tables'
    # per-patch values are expanded from it
    table_spec: TableSpec
    tables_by_device: bool  # built on the device (the installed stock helpers checked), else stock's on the host
    cu_window_seqlens: torch.Tensor | None = None  # window attention (Layout.windows)
    windows: torch.Tensor | None = None  # (len(WINDOW), windows) int64: host integers per window, moved with the plan
    window_seqlens: tuple[int, ...] = ()
    max_window_seqlen: int = 0
    device: str = "cpu"  # where the tensors above live (grid_thw stays on the host)
    # Per-item merge sizes (``Layout.item_merge_sizes``): (N,) int64 on the host (``items`` holds them too).
    merge_sizes: torch.Tensor | None = None
    merges: tuple[int, ...] = ()  # the same merge sizes as Python ints
    # Tokens the tower prepends to each attention segment before its blocks (``Layout.segment_class_token``: 1), which
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
        ``Layout.temporal_position_ids``);
        ``interp_indices`` / ``interp_weights`` (patches, taps) into a learned position table (``Layout.table``);
        a windowed tower's ``window_index`` (merged patches,): made on the plan's device from ``device_grid`` (no sync,
        nothing big uploaded), once."""
        if self.tables_made:
            return self.tables_made
        if self.tables_by_device:
            # (``patches``: the patch count as the traced forward's pixels give it, a size Dynamo keeps dynamic)
            tables = device_tables(self.items, self.num_patches if patches is None else patches, self.table_spec,
                                   self.windows)
        else:
            tables = {k: move(v, self.device)
                      for k, v in host_tables(self.grid_thw, self.table_spec, **merge_kwargs(self.merge_sizes)).items()}
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
        return self.table_spec.window is not None

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
    videos: 2), which divides the split sizes as stock's ``prod(-1) // merge**2 // temporal_merge_size`` does.
    ``merge_sizes``: a host (N,) tensor of each row's own merge size (``spec.item_merge_sizes``)."""
    grid, rows = _check_grid(grid_thw, spec.spatial_merge_size, name)
    host = grid.numpy()
    if spec.item_merge_sizes and merge_sizes is not None:
        return _item_merge_plan(grid, rows, merge_sizes, spec, name)
    merge = spec.spatial_merge_size
    # (The tower's own merge for its tables: 1 where it merges only after its encoder.)
    table_spec = TableSpec(spec.vision_module, spec.tower_merge or merge, spec.num_grid_per_side, spec.window_size,
                           spec.patch_size, spec.align_corners, temporal=spec.temporal_position_ids,
                           swap_hw=spec.interp_swap_hw, padding=spec.interp_padding, shuffle=spec.pixel_shuffle,
                           mode=spec.interp_mode, pool=spec.temporal_pooling)
    extra = {}
    if spec.window_size is not None:
        table = window_columns(rows, table_spec)  # (one host table per window: window_seqlens' sizes its first row)
        sizes = table[0].numpy() * table_spec.merge ** 2
        windows = tuple(sizes.tolist())
        extra.update(cu_window_seqlens=_cumulative(sizes), window_seqlens=windows, max_window_seqlen=max(windows),
                     windows=table)
    # (Sizes per item in NumPy over the grid's columns, then one ``tolist``: a NaViT batch has thousands of crops.)
    t, h, w = host.T
    seqlens = np.repeat(h * w, t)
    split_sizes = t * h * w // merge**2 // temporal_merge
    if spec.row_extra_tokens or spec.item_extra_tokens:  # (a merger that adds a newline per row, begin and end)
        split_sizes = t * (h // merge) * (w // merge + spec.row_extra_tokens) + spec.item_extra_tokens
    if spec.temporal_pooling is not None:  # a clip's frames averaged onto one frame's tokens
        split_sizes = h * w // merge**2
    if spec.clip_segments:  # one segment per image or video (stock's merge_temporal=True)
        seqlens = t * h * w
    cu_seqlens = _cumulative(seqlens)
    # (max and sums in NumPy, before the one ``tolist`` each: a NaViT batch has thousands of crops)
    longest, patches, features = int(seqlens.max()), int(seqlens.sum()), int(split_sizes.sum())
    seqlens, split_sizes = tuple(seqlens.tolist()), tuple(split_sizes.tolist())
    return VisionPlan(
        grid_thw=grid, rows=rows, seqlens=seqlens, split_sizes=split_sizes,
        max_seqlen=longest, n_patches=patches, cu_seqlens=cu_seqlens, device_grid=grid,
        features_follow_patches=features * merge**2 == patches,
        items=item_columns(host, table_spec), table_spec=table_spec,
        tables_by_device=device_tables_match_stock(table_spec), segment_prefix=int(spec.segment_class_token), **extra,
    )


def _item_merge_plan(grid: torch.Tensor, rows: tuple, merge_sizes, spec: ModelSpec, name: str) -> VisionPlan:
    """The plan of a grid whose rows have their own merge sizes: stock's split ``t*h*w // merge**2`` per row, the
    rotary ids made with each row's merge (no window, no learned table in such a tower)."""
    merges_name = name.replace("grid_thw", "merge_sizes")
    if not isinstance(merge_sizes, torch.Tensor) or merge_sizes.shape != (grid.shape[0],) \
            or merge_sizes.dtype.is_floating_point or merge_sizes.dtype == torch.bool:
        raise ValueError(f"{merges_name} must be an integer tensor of shape ({grid.shape[0]},) (one per {name} row), "
                         f"got {getattr(merge_sizes, 'shape', type(merge_sizes).__name__)}")
    merge_sizes = merge_sizes.to("cpu", torch.long)
    merges = merge_sizes.tolist()  # host tensor: no device involved
    if any(m <= 0 or h % m or w % m for (_, h, w), m in zip(rows, merges)):
        raise GridError(f"{name} heights and widths must be multiples of their {merges_name}, got {grid.tolist()} and "
                        f"{merges}")
    table_spec = TableSpec(spec.vision_module, 1, None, None, spec.patch_size, item_merges=True)
    seqlens = tuple(h * w for t, h, w in rows for _ in range(t))
    return VisionPlan(
        grid_thw=grid, rows=rows, seqlens=seqlens,
        split_sizes=tuple(t * h * w // m**2 for (t, h, w), m in zip(rows, merges)),
        max_seqlen=max(seqlens), n_patches=sum(seqlens), cu_seqlens=_cumulative(seqlens), device_grid=grid,
        items=item_columns(rows, table_spec, merges), table_spec=table_spec,
        tables_by_device=device_tables_match_stock(table_spec), merge_sizes=merge_sizes, merges=tuple(merges),
    )


def _check_grid(grid, merge: int, name: str) -> tuple[torch.Tensor, tuple]:
    """The grid as int64 on the host, and its rows as Python ints (checked there: a few integers)."""
    if not isinstance(grid, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of shape (N, 3), got {type(grid).__name__}")
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.shape[0] == 0:
        raise GridShapeError(f"{name} must have shape (N, 3) with N >= 1, got {tuple(grid.shape)}")
    if grid.dtype.is_floating_point or grid.dtype == torch.bool or grid.is_complex():
        raise GridDtypeError(f"{name} must hold integers (torch.long), got {grid.dtype}")
    grid = grid.to("cpu", torch.long)
    values = grid.numpy()  # (checked in NumPy, whole columns: a NaViT batch has thousands of rows)
    if (values <= 0).any():
        raise GridError(f"{name} must be positive everywhere, got {grid.tolist()}")
    if (values[:, 1:] % merge).any():
        raise GridError(f"{name} heights and widths must be multiples of spatial_merge_size={merge}, "
                        f"got {grid.tolist()}")
    return grid, _rows_of(values)


def _rows_of(values: np.ndarray) -> tuple:
    """The grid's rows as a tuple of ``(t, h, w)`` tuples of Python ints, one tuple object per distinct row: a NaViT
    batch has thousands of crops of a few sizes, and a tuple per row was a good part of its plan's host time."""
    if values.shape[0] <= 64 or int(values.max()) >= 2**20:
        return tuple(map(tuple, values.tolist()))
    span = int(values.max()) + 1
    _, first, inverse = np.unique((values[:, 0] * span + values[:, 1]) * span + values[:, 2], return_index=True,
                                  return_inverse=True)
    distinct = [tuple(row) for row in values[first].tolist()]
    return tuple(map(distinct.__getitem__, inverse.reshape(-1).tolist()))
