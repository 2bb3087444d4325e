"""``rope_index`` for the host, where the plan is made: the same numbers from a table of runs, in NumPy.

``rope.rope_index`` computes every token's position with whole-tensor ops shaped like the tokens, which is
what a device needs (no data-dependent shapes, so no wait). On the host, data-dependent shapes cost
nothing, and PyTorch's fixed cost per op (several microseconds, plus a fan-out over intra-op threads on a
busy machine) dominated the plan. So here the kept tokens are compacted once, cut into runs (a few per
image, frame or text span), everything but the final positions is computed per run, and the positions
take about fifteen passes over the tokens. The arithmetic is integer and exact, except a video time scale's
step, computed in the dtype PyTorch's promotion gives it (float32 for the processor's float32
seconds). ``tests/test_rope*.py`` check it against ``rope_index`` and stock on every layout they draw.
"""

from __future__ import annotations

import numpy as np
import torch

from .errors import MaskShapeError
from .rope import check_options, rope_index, time_steps
from .tensors import host_array

__all__ = ["read_by_runs", "row_runs", "rope_index_host", "runs_of"]

_STEP_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32)


def rope_index_host(input_ids, mm_token_type_ids, image_grid_thw=None, video_grid_thw=None, attention_mask=None,
                    *, spatial_merge_size: int, split_video_frames: bool = True, tokens_per_second=None,
                    second_per_grid_ts=None, truncate_seconds: bool = False,
                    video_temporal_merge: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_index`` (same arguments, same results) for host tensors."""
    tensors = (input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw, attention_mask)
    options = dict(spatial_merge_size=spatial_merge_size, split_video_frames=split_video_frames,
                   video_temporal_merge=video_temporal_merge)
    if tokens_per_second is not None or second_per_grid_ts is not None or truncate_seconds:
        options.update(tokens_per_second=tokens_per_second, second_per_grid_ts=second_per_grid_ts,
                       truncate_seconds=truncate_seconds)
    if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in (*tensors, second_per_grid_ts)):
        return rope_index(*tensors, **options)
    check_options(tokens_per_second, second_per_grid_ts, truncate_seconds, split_video_frames)
    B, S = input_ids.shape
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 and attention_mask.shape != (B, S):
        raise MaskShapeError(f"attention_mask {tuple(attention_mask.shape)} must match the tokens {(B, S)}")
    steps = None
    if tokens_per_second is not None:
        steps, n_steps = time_steps(tokens_per_second, second_per_grid_ts, truncate_seconds, torch.device("cpu"))
        if steps.dtype not in _STEP_DTYPES:  # (NumPy has no bfloat16; such seconds are PyTorch's business)
            return rope_index(*tensors, **options)
        steps = (steps.numpy(), n_steps)
    types = host_array(mm_token_type_ids).astype(np.int64, copy=False)
    keep = None if attention_mask is None else host_array(attention_mask) != 0
    if keep is not None and keep.all():
        keep = None
    grids = [None if g is None or g.shape[0] == 0 else host_array(g).astype(np.int64) for g in (image_grid_thw,
                                                                                            video_grid_thw)]
    pos, deltas = _positions(types, keep, *grids, steps, spatial_merge_size, split_video_frames, video_temporal_merge)
    return torch.from_numpy(pos).to(input_ids.dtype), torch.from_numpy(deltas)[:, None]


def runs_of(values: np.ndarray, row_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the runs of equal ``values`` (1D, rows flattened one after another); a run also
    starts wherever ``row_starts`` (booleans) says a row does."""
    new = row_starts.copy()
    new[1:] |= values[1:] != values[:-1]
    starts = np.flatnonzero(new)
    ends = np.empty_like(starts)
    ends[:-1], ends[-1:] = starts[1:], values.shape[0]
    return starts, ends - starts


def read_by_runs(tables: list[np.ndarray], table_of_run: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                 dtype) -> np.ndarray:
    """(2, K): each token of a run (``runs_of``' ``starts`` and ``lengths``) reads the (2, L) table ``tables[i]``
    of its run (``table_of_run[run]``; -1: a block of zeros) at its place in the run. Whole-row passes: a per-token
    position inside an item (a crop's, an image's) from a table per item size (a batch has a few), no scatter."""
    zeros = int(lengths.max(initial=0))  # (at least the longest run reading zeros: a bound in one reduction)
    table = np.concatenate([np.zeros((2, zeros), dtype=dtype), *tables], axis=1, dtype=dtype)
    start_of = zeros + np.cumsum([0] + [t.shape[1] for t in tables])[:-1]
    entry = np.append(start_of, 0)[table_of_run]  # (-1: the zeros at 0)
    return table.take(np.arange(int(lengths.sum())) + np.repeat(entry - starts, lengths), axis=1)


def row_runs(values: np.ndarray) -> np.ndarray:
    """Where each run of equal rows of the 2D int64 array ``values`` (N >= 1) starts: a NaViT batch's grid has
    thousands of crops, mostly of a few sizes side by side, and the plan computes per run, not per crop."""
    changed = np.zeros(values.shape[0], dtype=bool)
    changed[0] = True
    for column in values.T:  # (column by column: a 2D comparison reduced over its rows is several times slower)
        changed[1:] |= column[1:] != column[:-1]
    return np.flatnonzero(changed)


def _run_grids(kinds: np.ndarray, images, videos, merge: int, split_video_frames: bool, steps, temporal_merge: int):
    """Each run's (t, h, w) and video time step (1 elsewhere): grids taken in order across the batch. A whole-video
    run covers t // ``temporal_merge`` frames (a family that merges them after its tower)."""
    h = np.full(kinds.shape[0], merge, dtype=np.int64)  # text: a harmless merge x merge grid (one merged patch)
    w = h.copy()
    step = None
    image_runs, video_runs = kinds == 1, kinds == 2
    n_image_runs, n_video_runs = int(image_runs.sum()), int(video_runs.sum())
    if n_image_runs > (0 if images is None else images.shape[0]):
        raise RuntimeError("rope_index: the tokens hold more image runs than image_grid_thw has grids")
    if n_image_runs:
        h[image_runs], w[image_runs] = images[:n_image_runs, 1], images[:n_image_runs, 2]
    if split_video_frames:  # one run per video frame: frame f belongs to the first video whose frames exceed f
        frames_end = np.cumsum(videos[:, 0]) if videos is not None else np.zeros(0, dtype=np.int64)
        if n_video_runs > (int(frames_end[-1]) if frames_end.shape[0] else 0):
            raise RuntimeError("rope_index: the tokens hold more video frames than video_grid_thw has frames")
        video_of = np.searchsorted(frames_end, np.arange(n_video_runs), side="right")
    else:
        if n_video_runs > (0 if videos is None else videos.shape[0]):
            raise RuntimeError("rope_index: the tokens hold more video runs than video_grid_thw has grids")
        video_of = np.arange(n_video_runs)
    t = np.ones(kinds.shape[0], dtype=np.int64)  # temporal patches a run covers (a frame run: one)
    if n_image_runs:
        t[image_runs] = images[:n_image_runs, 0]
    if n_video_runs:
        h[video_runs], w[video_runs] = videos[video_of, 1], videos[video_of, 2]
        if not split_video_frames:
            t[video_runs] = videos[video_of, 0] // temporal_merge
    if steps is not None:
        values, n_steps = steps
        if n_steps is not None and n_video_runs > n_steps:
            raise RuntimeError("rope_index: the tokens hold more video runs than second_per_grid_ts has entries")
        step = np.ones(kinds.shape[0], dtype=values.dtype)
        step[video_runs] = values[np.minimum(video_of, values.shape[0] - 1)]
    return t, h, w, step


def _positions(types, keep, images, videos, steps, merge: int, split_video_frames: bool, temporal_merge: int):
    B, S = types.shape
    if keep is None:
        kept_types, row_of = types.reshape(-1), np.repeat(np.arange(B), S)
    else:
        kept_types, row_of = types[keep], np.nonzero(keep)[0]
    row_starts = np.ones(row_of.shape[0], dtype=bool)
    row_starts[1:] = row_of[1:] != row_of[:-1]
    starts, lengths = runs_of(kept_types, row_starts)
    kinds, run_row = kept_types[starts], row_of[starts]
    t, h, w, step = _run_grids(kinds, images, videos, merge, split_video_frames, steps, temporal_merge)
    vision = (kinds == 1) | (kinds == 2)
    # Stock walks the grids, not the runs: where a run's length is not its grid's token count (grids listed
    # out of order, say), stock places positions its own way or fails, and where a row has no kept token it
    # fails. Either way only stock's own index gives stock's answer: hand it over (the caller runs it).
    hm, wm = h // merge, w // merge
    if not np.array_equal(lengths[vision], (t * hm * wm)[vision]):
        raise RuntimeError("rope_index: the placeholder runs do not match the grids they take")
    if keep is not None and not keep.any(1).all():
        raise RuntimeError("rope_index: a row has no kept token")
    # Each text token advances the position by one, each vision run by max(h, w) // merge, anything else by
    # nothing; a run starts where the runs before it in its row end.
    advance = np.where(kinds == 0, lengths, np.where(vision, np.maximum(h, w) // merge, 0))
    before = np.cumsum(advance) - advance
    first_of_row = np.ones(kinds.shape[0], dtype=bool)
    first_of_row[1:] = run_row[1:] != run_row[:-1]
    row_start = np.zeros(B, dtype=before.dtype)
    row_start[run_row[first_of_row]] = before[first_of_row]
    base = before - row_start[run_row]

    # Per kept token: its offset in its run, and its run's values. (In int32 where it fits, as it does for any
    # batch a model takes: division is the costly op per token, and int32 division is several times int64's.)
    small = np.int32 if kept_types.shape[0] < 2**31 and (hm * wm).max(initial=0) < 2**31 else np.int64
    k = np.arange(kept_types.shape[0], dtype=small) - np.repeat(starts.astype(small), lengths)
    token_base = np.repeat(base, lengths)
    width = np.repeat(wm.astype(small), lengths)
    if (t[vision] == 1).all() and step is None:
        # Every vision run is one frame (images; video frames as runs): each token's frame is 0 and its place in
        # the frame its place in the run, without a division per token.
        frame, rest = 0, k
    else:
        frame, rest = np.divmod(k, np.repeat((hm * wm).astype(small), lengths))
    if step is not None:  # video frames sit step apart in time (truncated like stock's .long())
        token_step = np.repeat(step, lengths)
        scaled = (frame.astype(token_step.dtype) * token_step).astype(np.int64)
        frame = np.where(np.repeat(kinds == 2, lengths), scaled, frame)
    token_vision, token_text = np.repeat(vision, lengths), np.repeat(kinds == 0, lengths)
    along = np.where(token_text, k, 0)  # text: all three axes advance together
    row, col = np.divmod(rest, width)
    kept = np.empty((3, kept_types.shape[0]), dtype=np.int64)  # (written in place: no stacked copy)
    np.add(token_base, np.where(token_vision, frame, along), out=kept[0])
    np.add(token_base, np.where(token_vision, row, along), out=kept[1])
    np.add(token_base, np.where(token_vision, col, along), out=kept[2])
    if keep is None:
        pos = kept.reshape(3, B, S)
    else:
        pos = np.zeros((3, B, S), dtype=np.int64)
        pos[:, keep] = kept
    # Positions are >= 0 and padding is 0, so a plain max over the row is the max over its kept tokens
    # (stock fails on a row with none; here, as in rope_index, such a row gets delta 1).
    kept_per_row = S if keep is None else keep.sum(1)
    return pos, pos.max(axis=(0, 2)) + 1 - kept_per_row
