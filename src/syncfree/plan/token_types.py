"""Token types and their runs: where a batch's image and video placeholders are, as stock finds them, from the
host copies of ``input_ids`` / ``mm_token_type_ids`` (the plan's first step; nothing here touches a device)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rope_host import runs_of
from .spec import ModelSpec
from .tensors import host_array

__all__ = ["Runs", "placeholder_runs", "token_types", "span_types"]


@dataclass(frozen=True)
class Runs:
    """The runs of equal token types in each row (over every position, masked or not: stock counts
    placeholders that way), in row-major order."""

    kinds: np.ndarray  # the type of each run
    lengths: np.ndarray
    rows: np.ndarray  # the row each run is in
    n_rows: int
    starts: np.ndarray | None = None  # where each run starts in the flattened rows

    def per_row(self, kind: int) -> tuple[int, ...]:
        return tuple(np.bincount(self.rows[self.kinds == kind], minlength=self.n_rows).tolist())


def placeholder_runs(types: np.ndarray) -> Runs:
    """The runs of ``types`` (B, S), found in a few whole-array operations."""
    n_rows, width = types.shape
    flat = types.reshape(-1)
    row_starts = np.zeros(flat.shape[0], dtype=bool)
    row_starts[::width] = True
    starts, lengths = runs_of(flat, row_starts)
    return Runs(flat[starts], lengths, starts // width, n_rows, starts)


def token_types(spec: ModelSpec, input_ids, mm_token_type_ids) -> np.ndarray | None:
    """Token types (0 text, 1 image, 2 video) as stock sees placeholders: from input_ids when given (from
    mm_token_type_ids where video frames are written with the image placeholder: only they tell them apart; from
    input_ids' video start/end spans where those tell them apart, as that family's stock does)."""
    if spec.video_span_ids is not None and input_ids is not None and input_ids.dim() == 2:
        return span_types(host_array(input_ids), spec.image_token_id, *spec.video_span_ids)
    if (spec.video.frames_as_images and mm_token_type_ids is not None and mm_token_type_ids.dim() == 2
            and (input_ids is None or input_ids.shape == mm_token_type_ids.shape)):
        return host_array(mm_token_type_ids).astype(np.int64)
    if input_ids is not None and input_ids.dim() == 2:
        ids = host_array(input_ids)
        types = (ids == spec.image_token_id).astype(np.int64)
        types[ids == spec.video_token_id] += 2  # (in place where the videos are: a third of a full-size sum's time)
        return types
    if mm_token_type_ids is not None and mm_token_type_ids.dim() == 2:
        return host_array(mm_token_type_ids).astype(np.int64)
    return None


def span_types(ids: np.ndarray, image_token_id: int, start_id: int, end_id: int) -> np.ndarray:
    """Image placeholders typed 2 inside a video's start/end span and 1 outside (stock's ``in_video_span``)."""
    in_span = np.cumsum(ids == start_id, axis=-1) > np.cumsum(ids == end_id, axis=-1)
    return np.where(ids == image_token_id, np.where(in_span, 2, 1), 0).astype(np.int64)
