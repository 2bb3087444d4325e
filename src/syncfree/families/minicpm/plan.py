"""MiniCPM-V's part of the plan: NaViT crops as grid rows.

Its processor returns no ``grid_thw``: each crop is an ``(h, w)`` row of ``target_sizes`` (images) or
``target_sizes_videos`` (one per video frame crop), and the tokens per crop are ``h * w // 4`` (``downsample_mode="4x"``)
or ``// 16``. The plan keeps host copies of both, takes each row as the grid row ``(1, h, w)`` and divides by a merge of
2 or 4 on a side; the forward is handed the host copies (the tower's cumulative lengths and the merger's loop read them).
"""

from __future__ import annotations

import numpy as np
import torch

from ...plan.hooks import PlanHooks
from .canvas_rope import canvas_rope_index

__all__ = ["PLAN"]

_SIZES = ("target_sizes", "target_sizes_videos")


def _grid_rows(sizes, name: str):
    """NaViT ``(N, 2)`` crop sizes as ``(N, 3)`` grid rows ``(1, h, w)`` (host tensors; None stays None)."""
    if sizes is None:
        return None
    if not isinstance(sizes, torch.Tensor) or sizes.dim() != 2 or sizes.shape[1] != 2:
        raise ValueError(f"{name} must have shape (N, 2), got {tuple(getattr(sizes, 'shape', ()))}")
    if sizes.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8) and sizes.device.type == "cpu":
        values = sizes.detach().numpy()  # (a column of ones in NumPy: no PyTorch op on the host)
        return torch.from_numpy(np.concatenate([np.ones((values.shape[0], 1), values.dtype), values], axis=1))
    return torch.nn.functional.pad(sizes, (1, 0), value=1)


def crop_grids(host: dict) -> tuple:
    """The image and video grid rows of the crops (``PlanHooks.grids``)."""
    return tuple(_grid_rows(host[name], name) for name in _SIZES)


def crop_merge(config) -> int:
    """The merge on a side of the processor's ``image_token_divisor`` (4 or 16 tokens per 4 or 16 patches)."""
    return 2 if config.downsample_mode == "4x" else 4


# What MiniCPM-V 4.7's canvas index reads from the config beyond the rest: the markers, and the mode that sets its merge.
_CANVAS_FIELDS = ("video_token_id", "image_start_id", "image_end_id", "slice_start_id", "slice_end_id", "newline_id",
                  "downsample_mode")



def feature_words(kind: str, tokens: int, features: int, spec) -> str:
    """Stock's words where placeholders and features disagree (its get_placeholder_mask, images and videos alike)."""
    return f"Multimodal features and tokens do not match, tokens: {tokens}, features: {features}"


PLAN = PlanHooks(inputs=_SIZES, per_item=((_SIZES[0], "image"), (_SIZES[1], "video")), grid_inputs=_SIZES,
                 grids=crop_grids, merge=crop_merge, rope_config=_CANVAS_FIELDS, feature_words=feature_words,
                 rope_index=canvas_rope_index)
