"""Where the samples of a padding-free packed batch begin and end: the plan's ``Packing``.

``syncfree.packing_collator`` lays several samples end to end in each row (rows of at most ``max_tokens``, the rest
of a row padding). The patched forward keeps them apart wherever attention could cross a boundary: the text model's
masks are made by Transformers' own packed-sequence path (``masking_utils``: a block-diagonal causal mask, and the
sliding-window one likewise), handed these sequence ids instead of ids it would derive from the position ids on the
device (which reads the device, and which it skips when a cache is passed). Flash attention's variable-length kernel
takes ``cu_seq_lens`` and the longest length instead: the same boundaries, flattened over the rows.

Everything here is host integers and two small tensors, made once on the host from the segment lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .tensors import DeviceFields

__all__ = ["Packing", "packing_of", "packing_from_positions", "restarts_without_text_row", "rows_of", "PACKED_KEY",
           "FLASH_KWARGS"]

# Where a packing collator's batch says which segments are samples (popped by ``prepare``, kept in the plan).
PACKED_KEY = "syncfree_packing"
# The keyword arguments of flash attention's variable-length path (``Packing.flash_kwargs``).
FLASH_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


@dataclass
class Packing(DeviceFields):
    """The segments of each row of a packed batch: samples, then the row's padding (one segment, if any)."""

    rows: tuple[tuple[int, ...], ...]  # per row, the segment lengths in order (padding last); each row sums to S
    padding: tuple[int, ...]  # per row, the padding tokens at its end (0: none; its last segment otherwise)
    order: tuple[int, ...]  # the given index of each packed sample, in packed (row-major) order
    max_length: int  # the longest segment
    sequence_ids: torch.Tensor  # (B, S) int64: each token's segment, counted from 0 in each row
    cu_seq_lens: torch.Tensor  # (segments + 1,) int32: segment starts over the flattened (B * S) tokens
    device: str = "cpu"

    _TENSORS = ("sequence_ids", "cu_seq_lens")

    @property
    def batch_shape(self) -> tuple[int, int]:
        return len(self.rows), sum(self.rows[0]) if self.rows else 0

    @property
    def samples(self) -> int:
        return len(self.order)

    def flash_kwargs(self) -> dict:
        """What flash attention's variable-length path takes for these boundaries (Transformers' ``cu_seq_lens_q`` ...),
        over the rows flattened: it then attends within each segment, padding segments included."""
        return {"cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}

    def spans(self) -> list[tuple[int, int, int]]:
        """``(row, start, length)`` of each sample, in packed order (padding left out)."""
        found = []
        for row, (lengths, pad) in enumerate(zip(self.rows, self.padding)):
            start = 0
            for length in lengths[:len(lengths) - (1 if pad else 0)]:
                found.append((row, start, length))
                start += length
        return found


def rows_of(lengths: list[int], max_tokens: int, first_fit: bool = False) -> list[list[int]]:
    """Sample indices per row: in the order given, each row filled before the next starts (``first_fit``: each sample
    into the first row with room, keeping the given order within a row). Every length must be at most ``max_tokens``."""
    rows: list[list[int]] = []
    used: list[int] = []
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise ValueError(f"sample {i} has {n} tokens, more than max_tokens={max_tokens}")
        candidates = range(len(rows)) if first_fit else range(max(len(rows) - 1, 0), len(rows))
        slot = next((r for r in candidates if used[r] + n <= max_tokens), None)
        if slot is None:
            rows.append([])
            used.append(0)
            slot = len(rows) - 1
        rows[slot].append(i)
        used[slot] += n
    return rows


def packing_from_positions(position_ids, shape: tuple[int, int]) -> Packing | None:
    """The packing of a batch whose given positions are a text row and 3D rows, ``(4, B, S)`` (the M-RoPE families'
    padding-free layout), where the text row restarts inside a row: segments as Transformers' ``find_packed_sequence_indices``
    reads them (a new one wherever a position is not the one before plus 1). None for any other batch."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 3 or position_ids.shape[0] != 4 \
            or tuple(position_ids.shape[1:]) != tuple(shape) or position_ids.device.type != "cpu":
        return None
    text = position_ids[0].numpy()
    starts = np.diff(text, axis=-1, prepend=text[:, :1] - 1) != 1
    if not starts[:, 1:].any():
        return None
    rows = []
    for row in starts:
        edges = [0, *(np.flatnonzero(row[1:]) + 1).tolist(), len(row)]
        rows.append([b - a for a, b in zip(edges, edges[1:])])
    return packing_of(rows, list(range(sum(len(r) for r in rows))), shape[1])


def restarts_without_text_row(position_ids, shape: tuple[int, int]) -> bool:
    """True for 3D positions ``(3, B, S)`` that restart inside a row (all three back to 0 after a token that was not
    at 0): samples packed padding-free with their own 3D positions but no text row, whose boundaries neither
    Transformers nor the plan can read from them (a sample's vision tokens do not step by 1)."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 3 or position_ids.shape[0] != 3 \
            or tuple(position_ids.shape[1:]) != tuple(shape) or position_ids.device.type != "cpu" or shape[1] < 2:
        return False
    zero = (position_ids.numpy() == 0).all(axis=0)  # (B, S)
    return bool((zero[:, 1:] & ~zero[:, :-1]).any())


def packing_of(row_lengths: list[list[int]], order: list[int], width: int) -> Packing:
    """The packing of rows holding samples of ``row_lengths`` each, padded to ``width`` tokens."""
    rows, padding = [], []
    for lengths in row_lengths:
        used = sum(lengths)
        if used > width:
            raise ValueError(f"a row of {used} tokens does not fit in {width}")
        pad = width - used
        rows.append(tuple(lengths) + ((pad,) if pad else ()))
        padding.append(pad)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    starts = [0]
    for r, lengths in enumerate(rows):
        ids[r] = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        starts.extend(r * width + int(c) for c in np.cumsum(lengths))
    longest = max((n for lengths in rows for n in lengths), default=0)
    return Packing(tuple(rows), tuple(padding), tuple(order), longest, torch.from_numpy(ids),
                   torch.tensor(starts, dtype=torch.int32))
