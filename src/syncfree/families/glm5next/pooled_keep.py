"""GLM-5-Next's own rewrite helpers (its ``Family.helpers``): which key pools its pooled DSA indexer keeps, from the
plan's host mask instead of the device.

Stock (``Glm5NextTextIndexer.get_pooled_states``) drops the pools no row can use with ``keep = pool_valid.any(0)``
and three boolean selects ``[:, keep]``: each reads the number of kept pools from the device. Pools start at each
row's first valid key and pool ``p`` is valid when its ``kpool`` keys are all valid. Where a row's valid keys are
one contiguous run of ``n_b`` keys, pool ``p`` of that row is valid exactly when ``p < n_b // kpool``: ``keep`` is
then the prefix of length ``max_b(n_b) // kpool``. The valid keys are the 2D padding mask the forward was given
(cached, in a decode step, with a one per generated token), so the host knows that prefix where the plan holds the
mask: the kept pools are then taken with an index of that length (``index_select``-like: the same rows, in the
same order, as contiguous as stock's result; no read).

Where the host cannot tell, stock runs: masks with holes (right padding extended by generate(), custom masks), a
static cache whose slots are not all written yet (their valid channel is zero, the host mask does not say how many
are written: its ``get_seq_length`` is a device tensor), a cache holding tokens of an earlier call, compile.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

from ...plan import active
from ...rewrite.host_mask import host_padding_mask

__all__ = ["pools_written", "kept_pools", "kept_prefix"]

_local = threading.local()


def pools_written(packed_states: torch.Tensor, seq_len: int, kv_len, current_length) -> None:
    """Remember, for ``get_pooled_states(packed_states)``, whether every slot of ``packed_states`` holds a token
    of this forward or of earlier steps of this ``generate()`` call (``kv_len == current_length``: host ints of a
    dynamic cache or of no cache) and how many are this forward's own (``seq_len``)."""
    if torch.compiler.is_compiling():
        return
    written = (isinstance(kv_len, int) and isinstance(current_length, int) and kv_len == current_length
               == packed_states.shape[1])
    _local.last = (weakref.ref(packed_states), packed_states._version, seq_len if written else None)


def _own_tokens(packed_states: torch.Tensor) -> int | None:
    last = getattr(_local, "last", None)
    if last is None or last[0]() is not packed_states or last[1] != packed_states._version:
        return None
    return last[2]


def kept_prefix(valid: np.ndarray, kpool: int) -> int | None:
    """``max_b(n_b) // kpool`` for a (rows, keys) host mask whose rows each hold one contiguous run of valid keys
    (None otherwise: then the kept pools need not be a prefix)."""
    valid = valid.astype(bool)
    starts = valid[:, 0].astype(np.int64) + (valid[:, 1:] & ~valid[:, :-1]).sum(1)
    if (starts > 1).any():
        return None
    return int(valid.sum(1).max(initial=0)) // kpool


def _host_valid_keys(entry: active.Entry, valid_keys: torch.Tensor, own: int) -> np.ndarray | None:
    rows, width = valid_keys.shape
    if width == own:  # no earlier tokens: the valid keys are this forward's padding mask (ones without one)
        if entry.plan.host_mask is None:
            ok = entry.attention_mask is None and entry.plan.batch_shape[1] == width and rows % entry.plan.batch_shape[0] == 0
            return np.ones((rows, width), dtype=bool) if ok else None
        host = host_padding_mask(entry, valid_keys)
        return None if host is None or not isinstance(entry.attention_mask, torch.Tensor) else host.numpy()
    # Earlier tokens: only a decode step of generate(), whose mask is the prompt's extended with ones.
    if not entry.in_generate or entry.plan.host_mask is None or width <= entry.plan.host_mask.shape[1]:
        return None
    host = host_padding_mask(entry, valid_keys)
    return None if host is None else host.numpy()


def kept_pools(pool_valid: torch.Tensor, packed_states: torch.Tensor, valid_keys: torch.Tensor, kpool: int):
    """``pool_valid.any(0)`` (the pools to keep), or, where the host knows they are a prefix, the index of that
    prefix on the device: ``x[:, index]`` then holds what ``x[:, pool_valid.any(0)]`` holds."""
    entry = None if torch.compiler.is_compiling() else active.current()
    own = None if entry is None else _own_tokens(packed_states)
    host = None if own is None or valid_keys.dim() != 2 else _host_valid_keys(entry, valid_keys, own)
    length = None if host is None or host.shape != tuple(valid_keys.shape) else kept_prefix(host, kpool)
    if length is None or length > pool_valid.shape[1]:
        return pool_valid.any(0)
    return torch.arange(length, device=pool_valid.device)
