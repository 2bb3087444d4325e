"""What the vision tower derives from one modality's ``grid_thw``, planned on the host with the installed
Transformers' own helpers (so the numbers match stock's)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from .errors import GridDtypeError, GridError
from .spec import ModelSpec
from .tensors import DeviceFields

__all__ = ["VisionPlan", "vision_plan"]


@dataclass
class VisionPlan(DeviceFields):
    """What the vision tower derives from one modality's ``grid_thw``."""

    grid_thw: torch.Tensor  # (N, 3), on the host
    seqlens: tuple[int, ...]  # attention segment lengths: one per frame (h * w patches)
    split_sizes: tuple[int, ...]  # merged tokens per image or video
    max_seqlen: int
    cu_seqlens: torch.Tensor  # (segments + 1,) int32
    position_ids: torch.Tensor  # (patches, 2) rotary (row, col) ids
    interp_indices: torch.Tensor | None = None  # (patches, taps) into the learned position table (Qwen3-VL)
    interp_weights: torch.Tensor | None = None
    window_index: torch.Tensor | None = None  # merged-patch permutation into windows (Qwen2.5-VL)
    cu_window_seqlens: torch.Tensor | None = None
    window_seqlens: tuple[int, ...] = ()
    max_window_seqlen: int = 0
    device: str = "cpu"  # where the tensors above live (grid_thw stays on the host)

    _TENSORS = ("cu_seqlens", "position_ids", "interp_indices", "interp_weights", "window_index", "cu_window_seqlens")

    @property
    def num_patches(self) -> int:
        return sum(self.seqlens)

    def vision_kwargs(self) -> dict:
        """Keyword arguments for the vision tower: the stock helpers take these instead of computing them."""
        kwargs = {"cu_seqlens": self.cu_seqlens, "max_seqlen": self.max_seqlen, "position_ids": self.position_ids}
        # Attention layers find their host split sizes by the length of the cu_seqlens they are given
        # (full and window segmentations; equal lengths mean equal segmentations).
        seqlens = {len(self.seqlens) + 1: self.seqlens}
        if self.interp_indices is not None:
            kwargs.update(interp_indices=self.interp_indices, interp_weights=self.interp_weights)
        if self.window_index is not None:
            kwargs.update(window_index=self.window_index, cu_window_seqlens=self.cu_window_seqlens,
                          max_window_seqlen=self.max_window_seqlen)
            seqlens[len(self.window_seqlens) + 1] = self.window_seqlens
        kwargs["syncfree_seqlens"] = seqlens
        return kwargs


def vision_plan(grid_thw: torch.Tensor, spec: ModelSpec, name: str = "grid_thw") -> VisionPlan:
    """Build a VisionPlan on the host with the installed Transformers' own helpers (so the numbers match)."""
    grid = _check_grid(grid_thw, spec.spatial_merge_size, name)
    module = sys.modules.get(spec.vision_module) or __import__(spec.vision_module, fromlist=["_"])
    merge = spec.spatial_merge_size
    extra = {}
    if spec.num_grid_per_side is not None:
        extra["interp_indices"], extra["interp_weights"] = module.get_vision_interpolation_indices_and_weights(
            grid, num_grid_per_side=spec.num_grid_per_side, mode="bilinear", align_corners=True,
            spatial_merge_size=merge,
        )
    if spec.window_size is not None:
        window_index, cu_window = module.get_vision_window_index(
            grid, spatial_merge_size=merge, window_size=spec.window_size, patch_size=spec.patch_size)
        window_seqlens = tuple((cu_window[1:] - cu_window[:-1]).tolist())  # host tensor: no device involved
        extra.update(window_index=window_index, cu_window_seqlens=cu_window, window_seqlens=window_seqlens,
                     max_window_seqlen=max(window_seqlens))
    position_ids = module.get_vision_position_ids(grid, merge)
    rows = grid.tolist()  # host tensor: no device involved
    seqlens = tuple(h * w for t, h, w in rows for _ in range(t))
    cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(seqlens, dtype=torch.int64).cumsum(0)
    return VisionPlan(
        grid_thw=grid, seqlens=seqlens, split_sizes=tuple(t * h * w // merge**2 for t, h, w in rows),
        max_seqlen=max(seqlens), cu_seqlens=cu, position_ids=position_ids, **extra,
    )


def _check_grid(grid, merge: int, name: str) -> torch.Tensor:
    if not isinstance(grid, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of shape (N, 3), got {type(grid).__name__}")
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.shape[0] == 0:
        raise ValueError(f"{name} must have shape (N, 3) with N >= 1, got {tuple(grid.shape)}")
    if grid.dtype.is_floating_point or grid.dtype == torch.bool or grid.is_complex():
        raise GridDtypeError(f"{name} must hold integers (torch.long), got {grid.dtype}")
    grid = grid.to("cpu", torch.long)
    if bool((grid <= 0).any()):
        raise GridError(f"{name} must be positive everywhere, got {grid.tolist()}")
    if bool((grid[:, 1:] % merge != 0).any()):
        raise GridError(f"{name} heights and widths must be multiples of spatial_merge_size={merge}, "
                         f"got {grid.tolist()}")
    return grid
