"""GLM-Image's rotary index in NumPy on the host: stock's prompt positions and decode positions, per run of tokens.

Stock's ``get_rope_index`` walks each sample in Python: it pairs the sample's ``image_start`` and ``image_end`` ids,
gives the text before each source image running positions and the image a (frame, row, column) grid from there,
advancing the position by ``max(h, w)`` (one grid row of ``h * w`` tokens per frame, no merge), then lays out the
positions of the images still to be generated (the sample's last grids, last first, each ``max(h, w)`` on) and an end
marker, padding the samples' decode positions to one length with their last column. Here the same numbers come from a
prefix sum over the kept tokens (a text token advances by one, an image's first token by ``max(h, w)``, its other
tokens by none) and from the grids.

Where the layout is not the one modelled (an image whose tokens between its ids are not its grid's, the ids out of
order, ids that are not int64, a sample without grids beside one with, grids that ``images_per_sample`` does not
split), ``grid_rope_numpy`` returns None and the plan runs stock's own index on the host. ``tests/test_patch_glm_image.py``
checks it against stock's index over random layouts.
"""

from __future__ import annotations

import numpy as np
import torch

from ...plan.tensors import host_array

__all__ = ["grid_rope_numpy"]


def _rank(rows: np.ndarray) -> np.ndarray:
    """Each entry's place among the entries of its row (``rows`` sorted)."""
    first = np.searchsorted(rows, rows, side="left")
    return np.arange(rows.shape[0]) - first


def grid_rope_numpy(spec, host: dict) -> dict | None:
    """The Plan fields of stock's index (positions, deltas, decode positions, prefill length), or None where the
    layout is not modelled. ``host``: the plan's host copies (``input_ids``, ``image_grid_thw``, ``images_per_sample``,
    ``attention_mask``)."""
    ids, grid, per_sample, mask = (host.get(n) for n in ("input_ids", "image_grid_thw", "images_per_sample",
                                                         "attention_mask"))
    start_id, end_id = spec.config.image_start_token_id, spec.config.image_end_token_id
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 2):
        return None
    if not (isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.dtype == torch.long
            and isinstance(grid, torch.Tensor) and grid.dim() == 2 and grid.shape[1] == 3):
        return None
    B, S = ids.shape
    g = host_array(grid)
    if g.dtype.kind not in "iu" or (g <= 0).any():
        return None
    g = g.astype(np.int64)
    if per_sample is not None:
        counts = host_array(per_sample)
        if counts.dtype.kind not in "iu" or counts.shape != (B,) or (counts < 0).any() or counts.sum() != g.shape[0]:
            return None  # (stock's torch.split refuses, or a sample count other than the rows')
        counts = counts.astype(np.int64)
        offset = np.cumsum(counts) - counts
    else:  # (stock: every sample takes all the grids)
        counts, offset = np.full(B, g.shape[0]), np.zeros(B, dtype=np.int64)
    if not (counts.all() or not counts.any()):
        return None  # (stock stacks the decode positions of the samples with grids only)
    x = host_array(ids)
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] == S:
        keep = host_array(mask) == 1
    else:
        keep = np.ones((B, S), dtype=bool)
    padded = not keep.all()
    if padded:
        xs, row_of = x[keep], np.nonzero(keep)[0]
    else:  # (no padding: the rows as they are, and no scatter back)
        xs, row_of = x.reshape(-1), np.repeat(np.arange(B), S)
    kept = keep.sum(1)
    if not kept.all():
        return None  # (a row with no kept token: left to stock)
    row_begin = np.cumsum(kept) - kept
    K = xs.shape[0]

    # Stock pairs a sample's i-th image start (the token after it) with its i-th image end, for as many images as the
    # sample has grids; its decode grids are those beyond its image ends.
    starts, ends = np.flatnonzero(xs == start_id) + 1, np.flatnonzero(xs == end_id)
    s_row, e_row = row_of[np.minimum(starts - 1, K - 1)], row_of[ends]
    n_starts, n_ends = np.bincount(s_row, minlength=B), np.bincount(e_row, minlength=B)
    images = np.minimum(np.minimum(n_starts, n_ends), counts)
    s_keep, e_keep = _rank(s_row) < images[s_row], _rank(e_row) < images[e_row]
    s, e, rows = starts[s_keep], ends[e_keep], s_row[s_keep]
    which = offset[rows] + _rank(rows)
    t, h, w = g[which, 0], g[which, 1], g[which, 2]
    previous = np.where(_rank(rows) > 0, np.concatenate(([0], e[:-1])), row_begin[rows])
    if not (np.array_equal(e - s, t * h * w) and (s >= previous).all()):
        return None  # (stock's pieces would not tile the row as its tokens do)

    # Each image token's place in its image (int32 per token: division is the costly op there; none for the frame
    # where every image is one frame).
    length = e - s
    small = np.int32 if K < 2**31 else np.int64
    place = np.arange(int(length.sum()), dtype=small) - np.repeat((np.cumsum(length) - length).astype(small), length)
    tokens = np.repeat(s, length) + place

    # One prefix sum: text advances by one a token, an image by max(h, w) (booked on its first token).
    advance = np.ones(K, dtype=np.int64)
    advance[tokens] = 0
    advance[s] = np.maximum(h, w)
    total = np.cumsum(advance)
    before = total - advance
    if padded:
        pos = before - before[row_begin][row_of]
    else:  # (rows of S tokens: each row's start by broadcasting, not a gather per token)
        pos = (before.reshape(B, S) - before[row_begin][:, None]).reshape(-1)
    positions = np.broadcast_to(pos, (3, K)).copy()
    if (t == 1).all():
        frame, rest = 0, place
    else:
        frame, rest = np.divmod(place, np.repeat((h * w).astype(small), length))
    row, col = np.divmod(rest, np.repeat(w.astype(small), length))
    origin = np.repeat(pos[s], length)
    positions[0, tokens], positions[1, tokens], positions[2, tokens] = origin + frame, origin + row, origin + col
    if padded:
        out = np.ones((3, B, S), dtype=np.int64)
        out[:, keep] = positions
    else:
        out = positions.reshape(3, B, S)
    # Each sample's position after its prompt: its row's advances (stock's current_pos).
    final = np.add.reduceat(advance, row_begin)

    decode = None
    if counts.any():
        # Sample r decodes its last max(counts - image ends, 0) grids, last first, then an end marker.
        n_decode = np.maximum(counts - n_ends, 0)
        item_row = np.repeat(np.arange(B), n_decode)
        k = _rank(item_row)
        which = offset[item_row] + counts[item_row] - 1 - k
        dh, dw = g[which, 1], g[which, 2]
        step = np.maximum(dh, dw)
        step_before = np.cumsum(step) - step
        first_item = np.cumsum(n_decode) - n_decode
        at = final[item_row] + step_before - step_before[first_item[item_row]] if item_row.shape[0] else step_before
        end_pos = final + np.bincount(item_row, weights=step, minlength=B).astype(np.int64)
        size = dh * dw
        lengths = np.bincount(item_row, weights=size, minlength=B).astype(np.int64) + 1
        width = int(lengths.max())
        decode = np.broadcast_to(end_pos[:, None, None], (B, 3, width)).copy()  # (stock pads with the end marker)
        place = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
        within = np.repeat(np.cumsum(size) - size - (np.cumsum(size) - size)[first_item[item_row]], size) + place
        r, c = np.divmod(place, np.repeat(dw, size))
        base = np.repeat(at, size)
        sample = np.repeat(item_row, size)
        decode[sample, 0, within], decode[sample, 1, within], decode[sample, 2, within] = base, base + r, base + c
        decode = torch.from_numpy(decode)
    return dict(position_ids=torch.from_numpy(out), rope_deltas=torch.zeros((B, 1), dtype=torch.long),
                decode_position_ids=decode, prefill_len=S)
