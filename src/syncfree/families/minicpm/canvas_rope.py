"""MiniCPM-V 4.7's canvas M-RoPE index in NumPy on the host: stock's positions, computed per crop and frame.

Stock's ``get_rope_index`` walks each row in Python: ``itertools.groupby`` over the token types, then per frame and
per slice a ``linspace`` / ``meshgrid`` of positions and a few marker writes. At the 32k-token layout a batch has
2,080 crops, and the walk cost the plan ~130 ms. Here the same numbers come from arrays over the crops (runs of
placeholders) and frames (a thumbnail and the slices after it), then a handful of passes over the tokens:

* text (every token outside a frame's span ``[<image>, end of its closing markers)``) advances the position by one;
  a frame by ``max(canvas height, canvas width) + 1``; a frame's origin is what its row's text and frames before it
  advanced. (Stock's per-group bookkeeping never adds more: frames of a group touch, the spans between groups are
  text.)
* within a frame, stock's writes are replayed in its order, phase by phase over all frames at once: the base coat,
  the halo on ``<image>``, the thumbnail's far corner on ``</image>``, the ``</slice>`` then ``<slice>`` corners
  (a ``<slice>`` right after a ``</slice>`` overwrites it, as stock's next slice does), the crops' own positions,
  the newlines between rows of slices. A frame's writes are clipped where the next frame's span begins (stock's
  next frame overwrites them there).
* each crop's own (h, w) positions are stock's ``get_vision_position_ids`` itself, memoised per crop size and canvas
  (a batch has a few distinct ones), so its ``linspace`` rounding is stock's by construction.

Where a batch is laid out in a way this does not model (a crop at a row's first token, two crops touching, a crop
whose length is not its grid's, grids running out, token types beyond 0/1/2, a mask of other values than 0 and 1),
it returns None and the plan runs stock's own index on the host (the answer, or the error, is then stock's).
``tests/test_patch_minicpmv47.py`` checks it against stock's index over random layouts, well formed and not.
"""

from __future__ import annotations

import numpy as np
import torch

from ...plan.rope_host import read_by_runs, runs_of
from ...plan.rope_stock import stock_on_host
from ...plan.tensors import host_array

__all__ = ["canvas_rope_index"]


# Stock's positions of each crop size on its canvas met so far (a stream repeats a few sizes).
_CROPS: dict[tuple, np.ndarray] = {}


def _crop_positions(spec, h: int, w: int, canvas_h: int, canvas_w: int, merge: int) -> np.ndarray:
    """Stock's (h, w) positions of one crop of ``h`` x ``w`` patches on its canvas, from origin 0 and offset 0: a
    (2, tokens) int64 array. Stock's own method (its ``linspace`` in the default dtype, rounded), once per size."""
    key = (spec.vision_module, spec.rope.host_class, h, w, canvas_h, canvas_w, merge, torch.get_default_dtype())
    table = _CROPS.get(key)
    if table is None:
        found, _ = stock_on_host(spec.vision_module, spec.rope.host_class, spec.config, "get_vision_position_ids",
                                 start_position=0, grid_thw=[h, w], canvas_height=canvas_h, canvas_width=canvas_w,
                                 spatial_merge_size=merge)
        table = found[1:].numpy().astype(np.int64)
        table.setflags(write=False)
        if len(_CROPS) < 4096:  # (bounded: a stream of odd sizes recomputes rather than grows)
            _CROPS[key] = table
    return table


def canvas_rope_index(spec, host: dict, mask, runs=None):
    """``(position_ids (3, B, S) int64, rope_deltas (B, 1) int64)`` as stock's ``get_rope_index`` gives them for
    the host copies ``host`` (and the 2D ``mask``, None without one), with the config's ``downsample_mode``; None where
    the layout is not one this models (the caller runs stock's own index). ``runs``: the plan's placeholder runs over
    every position, which are these tokens' where every one is kept (the plan checked the types against the ids)."""
    config = spec.config
    ids, types = host["input_ids"], host["mm_token_type_ids"]
    if not (isinstance(ids, torch.Tensor) and isinstance(types, torch.Tensor) and ids.dim() == 2
            and types.shape == ids.shape):
        return None
    B, S = ids.shape
    x, y = host_array(ids), host_array(types)
    if y.dtype.kind not in "biu" or (y.size and (y.min() < 0 or y.max() > 2)):  # (two reductions, not five passes)
        return None  # (stock keys its grid iterators by type: 1 and 2 only)
    if mask is None:
        keep = None
    else:
        m = host_array(mask)
        low, high = (m.min(), m.max()) if m.size else (1, 1)
        if m.dtype.kind not in "biu" or low < 0 or high > 1:
            return None  # (stock's deltas subtract the mask's sum: only 0/1 makes that the kept count)
        keep = None if low == 1 else m != 0
    if keep is None:
        xs, ys, row_of = x.reshape(-1), y.reshape(-1), None  # (rows of S tokens each: a token's row is its index // S)
        counts = np.full(B, S)
    else:
        xs, ys, row_of = x[keep], y[keep], np.nonzero(keep)[0]
        counts = keep.sum(1)
    K = xs.shape[0]
    row_end = np.cumsum(counts)
    row_begin = row_end - counts
    positions = np.empty((3, K), dtype=np.int64) if K else np.zeros((3, 0), dtype=np.int64)  # (_fill writes all)
    if K:
        grids = _grids(host, config)
        if grids is None:
            return None
        found = (runs.starts, runs.lengths) if keep is None and runs is not None and runs.starts is not None else None
        if not _fill(positions, xs, ys, row_of, row_begin, row_end, grids, spec, config, found):
            return None
    if keep is None:  # (every token kept: the positions are the batch's, row after row)
        out = positions.reshape(3, B, S)
    else:
        out = np.zeros((3, B, S), dtype=np.int64)
        out[:, keep] = positions
    # (Positions are >= 0 and padding 0: the row's max is its kept tokens' max, as stock's amax over the row.)
    deltas = out.max(axis=(0, 2)) + 1 - counts
    return torch.from_numpy(out), torch.from_numpy(deltas.astype(np.int64))[:, None]


def _grids(host: dict, config):
    """Each modality's crop sizes as an (N, 2) int64 array (an empty one where absent); None where not integer pairs."""
    found = {}
    for kind, name in ((1, "target_sizes"), (2, "target_sizes_videos")):
        sizes = host.get(name)
        if sizes is None:
            found[kind] = np.zeros((0, 2), dtype=np.int64)
            continue
        if not isinstance(sizes, torch.Tensor) or sizes.dim() != 2 or sizes.shape[1] != 2:
            return None
        values = host_array(sizes)
        if values.dtype.kind not in "iu":
            return None
        found[kind] = values.astype(np.int64)
    return found


def _fill(positions, xs, ys, row_of, row_begin, row_end, grids, spec, config, runs=None) -> bool:
    """Write every kept token's positions into ``positions`` (3, K); False where the layout is not modelled.
    ``row_of``: each kept token's row, or None where every token is kept (rows of one length); ``runs``: the tokens'
    runs (starts, lengths), where the caller has them."""
    merge = 2 if config.downsample_mode == "4x" else 4
    slice_start = config.slice_start_id
    markers = np.array([slice_start, config.slice_end_id, config.image_start_id, config.image_end_id,
                        config.newline_id])
    K = xs.shape[0]
    if runs is None:
        row_starts = np.zeros(K, dtype=bool)
        row_starts[row_begin[row_begin < row_end]] = True
        runs = runs_of(ys, row_starts)
    starts, lengths = runs
    crop = ys[starts] != 0
    crop_runs = np.flatnonzero(crop)
    cs = starts[crop_runs]  # crops: maximal runs of one nonzero type
    length = lengths[crop_runs]
    ce = cs + length
    crow = row_of[cs] if row_of is not None else cs // (K // row_begin.shape[0])
    C = cs.shape[0]
    if not C:  # text only: each row counts from 0
        rows = row_of if row_of is not None else np.repeat(np.arange(row_begin.shape[0]), K // row_begin.shape[0])
        positions[:] = np.arange(K) - row_begin[rows]
        return True
    first = np.ones(C, dtype=bool)
    first[1:] = crow[1:] != crow[:-1]
    # Each crop needs a token before it that is not in the crop before (stock reads it, and puts a frame's halo there).
    bound = row_begin[crow].copy()
    bound[~first] = ce[:-1][~first[1:]]
    if (cs <= bound).any():
        return False
    # A crop after a ``<slice>`` (not its row's first) is a slice of the frame before; any other opens a frame.
    is_slice = ~first & (xs[cs - 1] == slice_start)
    frame_crop = np.flatnonzero(~is_slice)  # each frame's thumbnail crop
    F = frame_crop.shape[0]
    frame_of = np.cumsum(~is_slice) - 1
    last_crop = np.append(frame_crop[1:] - 1, C - 1).astype(np.int64)
    n_slices = last_crop - frame_crop
    frow, fm = crow[frame_crop], ys[cs[frame_crop]]
    ts, te = cs[frame_crop], ce[frame_crop]
    fs = ts - 1
    # A frame's span ends past the markers after its last crop (stock's _frame_end_idx), at its row's end at most.
    fe, limit = ce[last_crop].copy(), row_end[frow]
    for _ in range(8):  # (a step per marker after the crop, over the frames: a frame closes with one or two)
        going = np.flatnonzero(fe < limit)
        going = going[(xs[fe[going]][:, None] == markers).any(1)]  # (np.isin sorts: slower on a few markers)
        if not going.shape[0]:
            break
        fe[going] += 1
    else:  # (a longer run of markers: the first non-marker after each frame, by one pass over the tokens)
        non_marker = np.append(np.flatnonzero(~np.isin(xs, markers)), K)
        fe = np.minimum(non_marker[np.searchsorted(non_marker, ce[last_crop])], limit)
    end = fe.copy()  # clipped where the next frame of the row begins: its writes come later in stock
    same_row = frow[1:] == frow[:-1]
    end[:-1][same_row] = np.minimum(end[:-1][same_row], fs[1:][same_row])

    # Each crop takes the next grid of its frame's type, in crop order across the batch (stock's iterators).
    video = fm[frame_of] == 2
    n_video = int(np.count_nonzero(video))
    if C - n_video > grids[1].shape[0] or n_video > grids[2].shape[0]:
        return False  # (stock's iterator runs dry, or is None: it raises)
    if not n_video or n_video == C:  # (one kind: its grids in order)
        sizes = grids[2 if n_video else 1][:C]
    else:
        sizes = np.empty((C, 2), dtype=np.int64)
        sizes[~video], sizes[video] = grids[1][:C - n_video], grids[2][:n_video]
    if sizes.min() < 0:
        return False  # (a negative side: stock's own index says what that gives)
    lh, lw = (sizes >> (merge.bit_length() - 1)).T  # (sides // merge: a power of two, sides >= 0)
    if not np.array_equal(length, lh * lw):
        return False  # (stock's assignment of a crop's positions fails, or broadcasts one)

    # Canvas per frame: the thumbnail's own grid, or its slices' (rows x columns of the first slice's size).
    has = n_slices > 0
    canvas_h, canvas_w = lh[frame_crop].copy(), lw[frame_crop].copy()
    slice_h, slice_w = np.zeros(F, dtype=np.int64), np.zeros(F, dtype=np.int64)
    cols = np.zeros(F, dtype=np.int64)
    slice_idx = np.flatnonzero(is_slice)
    f = frame_of[slice_idx]  # each slice's frame
    k_in_frame = slice_idx - frame_crop[f] - 1  # a slice's place among its frame's slices
    if slice_idx.shape[0]:
        # Columns: up to the first gap between slices wider than ``</slice><slice>`` (a newline), else all of them.
        s_begin, s_end = cs[slice_idx], ce[slice_idx]
        gap_after = cs[np.minimum(slice_idx + 1, C - 1)] - s_end  # (tokens up to the next crop)
        wide = (slice_idx < last_crop[f]) & (gap_after > 2)
        candidate = np.where(wide, k_in_frame + 1, n_slices[f])
        firsts = np.flatnonzero(k_in_frame == 0)
        cols[has] = np.minimum.reduceat(candidate, firsts)
        n = n_slices[has]
        rows = n // cols[has]
        square = rows * cols[has] == n
        rows, cols[has] = np.where(square, rows, 1), np.where(square, cols[has], n)
        first_slice = frame_crop[has] + 1
        slice_h[has], slice_w[has] = lh[first_slice], lw[first_slice]
        canvas_h[has], canvas_w[has] = rows * slice_h[has], cols[has] * slice_w[has]

    # One prefix sum over the row: a text token advances the position by one, a frame's span by its canvas' larger
    # side + 1, booked on its last token; so every token of a span sits at the frame's origin (its base coat), and a
    # text token at its own position.
    in_frame = np.zeros(K + 1, dtype=np.int32)  # (int32: the frames open at a token, half the traffic of int64)
    np.add.at(in_frame, fs, 1)
    np.add.at(in_frame, end, -1)
    advance = (np.cumsum(in_frame[:K], dtype=np.int32) == 0).astype(np.int64)
    advance[end - 1] = np.maximum(canvas_h, canvas_w) + 1
    before = np.zeros(K, dtype=np.int64)  # (what the tokens before each advanced)
    np.cumsum(advance[:-1], out=before[1:])
    pos = positions[0]  # (the base coat: each token's position from its row's start)
    lengths_of_rows = row_end - row_begin
    if (lengths_of_rows == lengths_of_rows[0]).all():  # (rows of one length: each row's start by broadcasting)
        np.subtract(before.reshape(row_begin.shape[0], -1), before[row_begin][:, None],
                    out=pos.reshape(row_begin.shape[0], -1))
    else:
        np.subtract(before, np.append(before, 0)[row_begin][row_of], out=pos)  # (a row of no kept token begins at K)
    origin = pos[fs]
    if slice_idx.shape[0]:  # (each slice's place on its frame's canvas: its row and column of slices)
        slice_row, slice_col = np.divmod(k_in_frame, cols[f])
        f_slice_h, f_origin = slice_h[f], origin[f]
        h_off, w_off = slice_row * f_slice_h, slice_col * slice_w[f]

    # The crops' own positions: stock's per crop size and canvas, offset by the crop's place on its frame's canvas
    # (the frame's origin is already every crop token's base coat).
    # (A slice's canvas is stock's 0: its own grid.) One int64 code per (size, canvas), then the distinct codes
    # over the runs of equal ones, a frame's slices being one run: a few dozen, not every crop.
    span = int(max(sizes.max(), canvas_h.max(), canvas_w.max())) + 1
    if span < 2**15:
        codes = (sizes[:, 0] * span + sizes[:, 1]) * (span * span)
        codes[frame_crop] += canvas_h * span + canvas_w
        run_start = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
        codes, inverse = np.unique(codes[run_start], return_inverse=True)
        inverse = np.repeat(inverse.reshape(-1), np.diff(np.append(run_start, C)))
        unique = np.stack([codes // span**3, codes // span**2 % span, codes // span % span, codes % span], 1)
    else:
        canvas_of = np.zeros((C, 2), dtype=np.int64)
        canvas_of[frame_crop] = np.stack([canvas_h, canvas_w], 1)
        unique, inverse = np.unique(np.concatenate([sizes, canvas_of], 1), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
    tables = [_crop_positions(spec, *map(int, key), merge) for key in unique]
    # Every token reads its run's table at its place in the run (``read_by_runs``: a crop's run its crop's table,
    # any other zeros), plus its slice's place on its frame's canvas.
    table_of_run, run_hw = np.full(starts.shape[0], -1, dtype=np.int64), np.zeros((2, starts.shape[0]), dtype=np.int64)
    table_of_run[crop_runs] = inverse
    if slice_idx.shape[0]:
        run_hw[0, crop_runs[slice_idx]], run_hw[1, crop_runs[slice_idx]] = h_off, w_off
    hw = read_by_runs(tables, table_of_run, starts, lengths, np.int64)
    hw += np.repeat(run_hw, lengths, axis=1)
    np.add(hw, pos, out=positions[1:])

    def marker(where, h, w, keep):
        if not keep.all():  # (a marker past its frame's clipped end: the next frame writes it)
            where, h, w = where[keep], h[keep], w[keep]
        positions[1, where], positions[2, where] = h, w

    halo = np.maximum(origin - 1, 0)
    positions[1, fs], positions[2, fs] = halo, halo  # the halo on <image>
    marker(te, origin + canvas_h, origin + canvas_w, te < end)  # </image>: the thumbnail's far corner
    if slice_idx.shape[0]:
        corner_h, corner_w = f_origin + h_off, f_origin + w_off
        marker(s_end, corner_h + lh[slice_idx] - 1, corner_w + lw[slice_idx] - 1, s_end < end[f])
        where = s_begin - 1  # (after every </slice>: a <slice> there wins)
        positions[1, where], positions[2, where] = corner_h, corner_w

        # The newlines ending a row of slices (a gap wider than ``</slice><slice>``): past that row's right edge.
        ending = np.flatnonzero(wide)
        gap, first_newline = gap_after[ending] - 2, s_end[ending] + 1
        if (gap == 1).all():  # (one newline per row of slices, as the processor writes)
            where = first_newline
        else:
            where = np.repeat(first_newline, gap) + (np.arange(int(gap.sum()))
                                                     - np.repeat(np.cumsum(gap) - gap, gap))
        frame = f[ending]
        positions[1, where] = np.repeat(f_origin[ending] + (slice_row[ending] + 1) * f_slice_h[ending] - 1, gap)
        positions[2, where] = np.repeat(f_origin[ending] + cols[frame] * slice_w[frame], gap)
    return True
