"""HunYuan-VL's and HY-V4-VL's rotary indexes in NumPy on the host: stock's positions, per run of tokens.

Both stock indexes walk each row in Python (``itertools.groupby`` over ``mm_token_type_ids.tolist()``, a ``meshgrid``
per image); at the 32k-token layout that cost the plan ~7 ms. Here the kept tokens are cut into runs of one type once,
every run's values come from its grid row, and the positions take a few passes over the tokens:

* HunYuan-VL: every axis counts the kept tokens of the row (``arange``); on each image run's grid tokens (the run less
  its ``im_start`` / ``im_end`` when it is two longer than the grid) the last three axes become (column, row, image
  ordinal across the batch), over ``lh`` rows of ``lw + 1`` columns (a newline column per row).
* HY-V4-VL: text advances the position by one per token, an image or video run by ``t * block`` with ``block =
  max(lh, lw + 1)``; a frame ``f`` of a run starting at ``p`` sits at ``p + f * block`` on all three axes, its rows and
  columns added on the height and width axes.

Where stock fails (a run whose length is not its grid's, grids running out or, for HunYuan-VL, left over, a row with no
kept token, a type without grids) or a mask holds values other than 0 and 1, these return None and the plan runs
stock's own index on the host, which gives stock's answer or its error. ``tests/test_patch_hunyuan.py`` and
``tests/test_patch_hyv4vl.py`` check them against stock's index over random layouts.
"""

from __future__ import annotations

import numpy as np
import torch

from ...plan.rope_host import runs_of
from ...plan.tensors import host_array

__all__ = ["hunyuan_rope_index", "hyv4_rope_index"]


def _kept_runs(host: dict, mask):
    """The kept tokens' types flattened row after row, cut into runs: (B, S, keep, counts, starts, lengths, kinds,
    run rows); None where the inputs are not what stock's walk takes as it is here modelled."""
    ids, types = host["input_ids"], host["mm_token_type_ids"]
    if not (isinstance(ids, torch.Tensor) and isinstance(types, torch.Tensor) and ids.dim() == 2
            and types.shape == ids.shape and ids.dtype == torch.long):
        return None
    B, S = ids.shape
    y = host_array(types)
    if y.dtype.kind not in "biu":
        return None
    keep = None
    if mask is not None:
        m = host_array(mask)
        if m.dtype.kind not in "biu" or ((m != 0) & (m != 1)).any():
            return None
        keep = None if m.all() else m != 0
    if keep is None:
        flat, counts = y.reshape(-1), np.full(B, S)
    else:
        flat, counts = y[keep], keep.sum(1)
    if not counts.all():
        return None  # (a row with no kept token: stock's max over it fails)
    row_begin = np.cumsum(counts) - counts
    row_starts = np.zeros(flat.shape[0], dtype=bool)
    row_starts[row_begin] = True
    starts, lengths = runs_of(flat, row_starts)
    run_row = np.searchsorted(row_begin, starts, side="right") - 1
    return B, S, keep, counts, row_begin, starts, lengths, flat[starts].astype(np.int64), run_row


def _grid(host: dict, name: str):
    grid = host.get(name)
    if grid is None:
        return None
    if not isinstance(grid, torch.Tensor) or grid.dim() != 2 or grid.shape[1] != 3 or host_array(grid).dtype.kind not in "iu":
        return False
    return host_array(grid).astype(np.int64)


def _scatter(positions: np.ndarray, B: int, S: int, keep) -> torch.Tensor:
    """(axes, kept tokens) -> (axes, B, S), padding 0 (stock's zeros)."""
    if keep is None:
        return torch.from_numpy(positions.reshape(positions.shape[0], B, S))
    out = np.zeros((positions.shape[0], B, S), dtype=np.int64)
    out[:, keep] = positions
    return torch.from_numpy(out)


def hunyuan_rope_index(spec, host: dict, mask, runs=None):
    """HunYuan-VL's ``get_rope_index`` (``len(mrope_section)`` axes), as stock gives it; None where not modelled."""
    config = spec.config
    axes = len((config.text_config.rope_parameters or {}).get("mrope_section", []) or [])
    found = _kept_runs(host, mask)
    grid = _grid(host, "image_grid_thw")
    if axes < 3 or found is None or grid is False:
        return None
    B, S, keep, counts, row_begin, starts, lengths, kinds, run_row = found
    K = int(counts.sum())
    row_of = np.repeat(np.arange(B), counts)
    local = np.arange(K) - row_begin[row_of]
    positions = np.broadcast_to(local, (axes, K)).copy()  # every axis counts the row's kept tokens
    if grid is not None:
        image = np.flatnonzero(kinds == 1)
        if image.shape[0] != grid.shape[0]:
            return None  # (stock raises: more image runs than grids, or grids left over)
        merge = config.vision_config.spatial_merge_size
        lh, lw = grid[:, 1] // merge, grid[:, 2] // merge
        tokens = lh * (lw + 1)
        length = lengths[image]
        framed = length == tokens + 2  # (the run holds its im_start and im_end too)
        if not (framed | (length == tokens)).all():
            return None  # (stock raises: a run that is not its grid's tokens)
        first = starts[image] + framed
        small = np.int32 if K < 2**31 else np.int64  # (int32: division is the costly op per token)
        place = np.arange(int(tokens.sum()), dtype=small) - np.repeat((np.cumsum(tokens) - tokens).astype(small), tokens)
        where = np.repeat(first, tokens) + place
        row, col = np.divmod(place, np.repeat((lw + 1).astype(small), tokens))
        offset = axes - 3
        positions[offset, where] = col
        positions[offset + 1, where] = row
        positions[offset + 2, where] = np.repeat(np.arange(image.shape[0]), tokens)
    # (stock's delta: the max of the row's kept positions, + 1, - its kept tokens)
    deltas = np.maximum.reduceat(positions.max(axis=0), row_begin) + 1 - counts
    return _scatter(positions, B, S, keep), torch.from_numpy(deltas.astype(np.int64))[:, None]


def hyv4_rope_index(spec, host: dict, mask, runs=None):
    """HY-V4-VL's ``get_rope_index`` (3 axes), as stock gives it; None where not modelled."""
    found = _kept_runs(host, mask)
    grids = {1: _grid(host, "image_grid_thw"), 2: _grid(host, "video_grid_thw")}
    if found is None or any(g is False for g in grids.values()):
        return None
    B, S, keep, counts, row_begin, starts, lengths, kinds, run_row = found
    if not np.isin(kinds, (0, 1, 2)).all():
        return None  # (stock's grid iterators are keyed by type 1 and 2)
    merge = spec.config.vision_config.spatial_merge_size
    n = kinds.shape[0]
    t, lh, lw = np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for kind in (1, 2):
        runs = np.flatnonzero(kinds == kind)
        if not runs.shape[0]:
            continue
        grid = grids[kind]
        if grid is None or runs.shape[0] > grid.shape[0]:
            return None  # (stock's iterator is None or runs dry: it raises)
        rows = grid[:runs.shape[0]]
        t[runs], lh[runs], lw[runs] = rows[:, 0], rows[:, 1] // merge, rows[:, 2] // merge
    vision = kinds != 0
    block = np.maximum(lh, lw + 1)
    frame_tokens = lh * (lw + 1)
    if not np.array_equal(lengths[vision], (t * frame_tokens)[vision]) or not (frame_tokens[vision] > 0).all():
        return None  # (stock's positions would not fit the row, or an empty grid's max fails)
    advance = np.where(vision, t * block, lengths)
    before = np.cumsum(advance) - advance
    row_start = before[np.searchsorted(starts, row_begin)]
    base = before - row_start[run_row]  # where each run starts in its row
    # Per token, from its run's values by np.repeat (int32 where it fits: division is the costly op per token; no
    # frame division where every image or video is one frame).
    K = int(lengths.sum())
    small = np.int32 if K < 2**31 else np.int64
    k = np.arange(K, dtype=small) - np.repeat(starts.astype(small), lengths)
    token_vision = np.repeat(vision, lengths)
    if (t[vision] == 1).all():
        frame_part, rest = 0, k
    else:
        frame, rest = np.divmod(k, np.repeat(np.maximum(frame_tokens, 1).astype(small), lengths))
        frame_part = frame * np.repeat(block, lengths)
    row, col = np.divmod(rest, np.repeat((lw + 1).astype(small), lengths))
    positions = np.empty((3, K), dtype=np.int64)
    np.add(np.repeat(base, lengths), np.where(token_vision, frame_part, k), out=positions[0])
    np.add(positions[0], np.where(token_vision, row, 0), out=positions[1])
    np.add(positions[0], np.where(token_vision, col, 0), out=positions[2])
    deltas = np.maximum.reduceat(positions.max(axis=0), row_begin) + 1 - counts
    return _scatter(positions, B, S, keep), torch.from_numpy(deltas.astype(np.int64))[:, None]
