"""The Omni thinkers' rotary index in NumPy on the host, for batches of images, videos and text (no audio).

Stock's ``get_rope_index`` (Qwen3-Omni's and Qwen2.5-Omni's) walks each row in Python: ``input_tokens.index`` from
item to item, a ``meshgrid`` per image or video, ``.max()`` between pieces; at the 32k-token layout that cost the plan
5-6 ms. Without audio, a row is text and items laid out ``<vision_start> placeholders <vision_end>``, and stock's
positions are: text advances by one per token; an item's ``<vision_start>`` (stock's "bos") takes the next position
``p``, its placeholders ``p + 1 + (t_index[frame], row, col)`` over ``t`` frames of ``h // merge`` x ``w // merge``, and
its ``<vision_end>`` ("eos") ``p + 2 + m`` with ``m`` the largest of those offsets; the next token goes on from there.
Here every token gets its run's start from one prefix sum over the row and its offsets from its item's grid.

``t_index`` is stock's arithmetic, replayed in float32 as PyTorch does it: ``arange(t) * position_id_per_seconds`` for
an image (integer where the config value is), ``arange(t) * float32(seconds) * position_id_per_seconds`` for a video;
Qwen2.5-Omni truncates it (``.long()``), Qwen3-Omni keeps it a float and so do its positions and deltas: there only
whole values below 2**24 are taken (float32 holds those exactly, so integer arithmetic gives stock's floats).

Anything else returns None and the plan runs stock's own index on the host, which gives stock's answer or its error:
audio in the batch (its interleaving by time or by chunk stays stock's), ``use_audio_in_video`` with a video, an item
not laid out as above, grids or seconds running out, a row with no kept token, a mask with other values than 0 and 1.
``tests/test_patch_omni.py`` checks it against stock's index over random layouts.
"""

from __future__ import annotations

import numpy as np
import torch

from ...plan.rope_host import read_by_runs, runs_of
from ...plan.tensors import host_array

__all__ = ["qwen3_omni_rope_index", "qwen2_5_omni_rope_index"]

_EXACT = 2**24  # float32 holds every integer below this


def qwen3_omni_rope_index(spec, host: dict, mask, use_audio_in_video: bool = False, runs=None):
    """Qwen3-Omni's index: float32 positions (padding 0) and float32 deltas; None where not modelled."""
    if mask is None:
        return None  # (stock's index indexes the mask it is given)
    return _omni_index(spec, host, mask, use_audio_in_video, qwen3=True)


def qwen2_5_omni_rope_index(spec, host: dict, mask, use_audio_in_video: bool = False, runs=None):
    """Qwen2.5-Omni's index: positions in the ids' dtype (padding 1) and int64 deltas; None where not modelled."""
    return _omni_index(spec, host, mask, use_audio_in_video, qwen3=False)


def _time_offsets(frames: np.ndarray, seconds: np.ndarray | None, per_second, qwen3: bool):
    """Each frame's ``t_index`` as stock computes it (``frames``: the frame numbers; ``seconds``: the item's seconds per
    grid for a video, None for an image), as int64; None where Qwen3-Omni's float would not be a whole number."""
    if seconds is None and isinstance(per_second, int):
        values = frames * per_second  # (int64 throughout in stock too)
    else:
        values = frames.astype(np.float32)
        if seconds is not None:
            values = values * seconds.astype(np.float32)
        values = values * np.float32(per_second)
    if qwen3:
        whole = np.trunc(values)
        if not (np.array_equal(whole, values) and (np.abs(values) < _EXACT).all()):
            return None
        return whole.astype(np.int64)
    values = np.trunc(values).astype(np.int64) if values.dtype != np.int64 else values
    if not (np.abs(values) < _EXACT).all():
        return None  # (stock passes them through a float32 tensor)
    return values


def _one_frame_items(pos, starts, lengths, item, lh, lw, time_shift, place_shift):
    """The (3, K) positions of a batch whose items are one frame each: every token at its base coat ``pos``, an
    item's placeholders shifted by its ``time_shift`` (time) and ``place_shift`` plus their (row, col) in its
    ``lh`` x ``lw`` grid (height, width). The (row, col) come from a table per grid size (a batch has a few), read
    at each run's start plus the token's place in the run; a run that is not an item reads a block of zeros."""
    sizes = lh * (int(lw.max(initial=0)) + 1) + lw
    _, one_of_each, inverse = np.unique(sizes, return_index=True, return_inverse=True)
    tables = [np.stack(np.divmod(np.arange(int(lh[i] * lw[i]), dtype=pos.dtype), pos.dtype.type(lw[i])))
              for i in one_of_each]
    runs = np.flatnonzero(item)
    table_of_run, shift = np.full(starts.shape[0], -1, dtype=np.int64), np.zeros((2, starts.shape[0]), dtype=pos.dtype)
    table_of_run[runs] = inverse.reshape(-1)
    shift[0, runs], shift[1, runs] = time_shift, place_shift
    positions = np.empty((3, pos.shape[0]), dtype=pos.dtype)
    shifts = np.repeat(shift, lengths, axis=1)
    np.add(pos, shifts[0], out=positions[0])
    hw = read_by_runs(tables, table_of_run, starts, lengths, pos.dtype)
    hw += shifts[1]
    np.add(hw, pos, out=positions[1:])
    return positions


def _omni_index(spec, host: dict, mask, use_audio_in_video: bool, qwen3: bool):
    config = spec.config
    ids = host["input_ids"]
    images, videos = host.get("image_grid_thw"), host.get("video_grid_thw")
    if not (isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.dtype == torch.long) \
            or (images is None and videos is None) or torch.get_default_dtype() != torch.float32:
        return None
    B, S = ids.shape
    x = host_array(ids)
    if mask is None:
        keep = np.ones((B, S), dtype=bool)
    else:
        m = host_array(mask)
        if m.dtype.kind not in "biu" or m.shape != (B, S) or ((m != 0) & (m != 1)).any():
            return None
        keep = m == 1
    counts = keep.sum(1)
    if not counts.all():
        return None  # (stock fails on a row with no kept token)
    padded = not keep.all()
    if padded:
        xs, row_of = x[keep], np.nonzero(keep)[0]
    else:  # (no padding: the rows as they are, and no scatter back)
        xs, row_of = x.reshape(-1), np.repeat(np.arange(B), S)
    K = xs.shape[0]
    row_end = np.cumsum(counts)
    row_begin = row_end - counts
    if ((xs == config.audio_token_id) | (xs == config.audio_start_token_id)).any():
        return None  # (audio: stock's own interleaving)
    start_id = config.vision_start_token_id
    kind = (xs == config.image_token_id).view(np.int8) + 2 * (xs == config.video_token_id).view(np.int8)
    row_starts = np.zeros(K, dtype=bool)
    row_starts[row_begin] = True
    starts, lengths = runs_of(kind, row_starts)
    item = kind[starts] != 0
    s, e, kinds = starts[item], starts[item] + lengths[item], kind[starts[item]]
    rows = row_of[s] if s.shape[0] else np.zeros(0, dtype=np.int64)
    # Each item: ``<vision_start>`` just before it in its row, a closing token after it there (not the start of
    # another item), and every ``<vision_start>`` opens one.
    if (s <= row_begin[rows]).any() or (xs[s - 1] != start_id).any() or (e >= row_end[rows]).any():
        return None
    if (xs[e][:, None] == np.array([start_id, config.image_token_id, config.video_token_id])).any():
        return None
    if np.count_nonzero(xs == start_id) != s.shape[0]:
        return None
    if use_audio_in_video and (kinds == 2).any():
        return None  # (stock then pairs each video with an audio clip)

    # Each item's grid (in order across the batch, by kind) and its frames' time offsets.
    merge = spec.spatial_merge_size
    per_second = config.position_id_per_seconds
    n = s.shape[0]
    t, lh, lw = (np.zeros(n, dtype=np.int64) for _ in range(3))
    seconds = host.get("video_second_per_grid")
    for k, grid in ((1, images), (2, videos)):
        chosen = np.flatnonzero(kinds == k)
        if not chosen.shape[0]:
            continue
        if grid is None or grid.dim() != 2 or grid.shape[1] != 3 or chosen.shape[0] > grid.shape[0]:
            return None
        g = host_array(grid).astype(np.int64)[:chosen.shape[0]]
        if (g <= 0).any() or (g[:, 1:] % merge).any():
            return None
        t[chosen], lh[chosen], lw[chosen] = g[:, 0], g[:, 1] // merge, g[:, 2] // merge
        if k == 2 and (not isinstance(seconds, torch.Tensor) or seconds.dim() != 1
                       or seconds.shape[0] < chosen.shape[0] or seconds.dtype not in (torch.float32, torch.float64)):
            return None  # (stock indexes second_per_grids per video, in float32)
    if not np.array_equal(e - s, t * lh * lw):
        return None  # (stock's walk steps by the grid's token count, not the run's)
    frames = np.arange(int(t.sum())) - np.repeat(np.cumsum(t) - t, t)  # each frame's number in its item
    frame_item = np.repeat(np.arange(n), t)
    offsets = np.zeros(frames.shape[0], dtype=np.int64)
    for k in (1, 2):
        chosen = kinds[frame_item] == k
        if chosen.any():
            per_video = None
            if k == 2:
                video_ordinal = np.cumsum(kinds == 2) - 1
                per_video = host_array(seconds)[video_ordinal[frame_item[chosen]]]
            found = _time_offsets(frames[chosen], per_video, per_second, qwen3)
            if found is None:
                return None
            offsets[chosen] = found
    top = np.maximum(np.maximum.reduceat(offsets, np.cumsum(t) - t) if n else offsets[:0], np.maximum(lh, lw) - 1)

    # One prefix sum: a text token advances by one, an item (from <vision_start> to its closing token) by top + 3,
    # booked on its <vision_start>. (Positions in int32 where every one fits, as the plan uploads them: half the
    # memory traffic of the passes over the tokens below.)
    length = e - s
    most = K + int((top + 3).sum()) + int(offsets.max(initial=0))
    wide = np.int32 if most < 2**31 and int(offsets.min(initial=0)) > -(2**31) else np.int64
    advance = np.repeat((~item).astype(wide), lengths)  # (1 a text token, 0 a placeholder: by runs, one pass)
    advance[e] = 0
    advance[s - 1] = top + 3
    before = np.cumsum(advance, dtype=wide) - advance
    if padded:
        pos = before - before[row_begin][row_of]
    else:  # (rows of S tokens: each row's start by broadcasting, not a gather per token)
        pos = (before.reshape(B, S) - before[row_begin][:, None]).reshape(-1)
    origin = pos[s - 1] + 1  # where each item's placeholders start (their base coat, pos, is origin + top + 2)
    first_frame = np.cumsum(t) - t
    if (t == 1).all():  # (one frame an item, as images are: whole-row passes by runs, no scatter per placeholder)
        positions = _one_frame_items(pos, starts, lengths, item, lh, lw, offsets[first_frame] - top - 2, -top - 2)
    else:
        # Each placeholder's place in its item, frame, row and column (int32: division is the costly op per token).
        small = np.int32 if K < 2**31 else np.int64
        place = np.arange(int(length.sum()), dtype=small) - np.repeat((np.cumsum(length) - length).astype(small),
                                                                       length)
        tokens = np.repeat(s, length) + place
        positions = np.broadcast_to(pos, (3, K)).copy()
        frame, rest = np.divmod(place, np.repeat((lh * lw).astype(small), length))
        row, col = np.divmod(rest, np.repeat(lw.astype(small), length))
        base = np.repeat(origin, length)
        positions[0, tokens] = base + offsets[np.repeat(first_frame, length) + frame]
        positions[1, tokens] = base + row
        positions[2, tokens] = base + col
    positions[:, e] = origin + top + 1  # the closing token
    top_of_token = positions.max(axis=0)
    if qwen3 and (top_of_token.max(initial=0) >= _EXACT or ((offsets < 0).any() and -positions.min() >= _EXACT)):
        return None
    deltas = np.maximum.reduceat(top_of_token, row_begin) + 1 - counts
    dtype = np.float32 if qwen3 else np.int64
    if padded:
        out = np.full((3, B, S), 0 if qwen3 else 1, dtype=dtype)
        out[:, keep] = positions
    else:
        out = positions.reshape(3, B, S).astype(dtype, copy=False)
    return torch.from_numpy(out), torch.from_numpy(deltas.astype(dtype))[:, None]
