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

A traced forward cannot walk a host mask, so the plan finds that length once when it is built (``kept_counts``,
its ``PlanHooks.fields``: ``Plan.family_counts``); the traced indexer takes it where the states it pools are the
forward's own tokens, no more (the batch's width: no cache, or an empty one as wide as the batch). In a stream's
traced forward (``Layout.stream``) that length is a size of the graph (``PlanHooks.sizes``: ``Plan.carriers``) and
the pooling runs as one operator (``pooled_states``) that calls stock's ``get_pooled_states`` with it: the number of
pools, ``ceil(tokens / kpool)``, never reaches the graph. Elsewhere the graph is specialised on that length.

Where the host cannot tell, stock runs: masks with holes (right padding extended by generate(), custom masks), a
static cache whose slots are not all written yet (their valid channel is zero, the host mask does not say how many
are written: its ``get_seq_length`` is a device tensor), a cache holding tokens of an earlier call.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

from ...plan import active
from ...plan.spec import layout_of
from ...rewrite.host_mask import host_padding_mask
from ...rewrite.op_keys import key_of, keyed

__all__ = ["pools_written", "pooled_states", "kept_pools", "kept_prefix", "kept_counts", "kpool_value"]

KEPT = "kept_pools"  # (Plan.family_counts: the kept prefix; a size carrier in a stream)
_ANY_KEPT = "any_kept_pool"  # (whether that prefix holds a pool: a bool a stream's graph may guard on)

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


def kpool_value(config) -> dict:
    """The indexer's pool size (``PlanHooks.values``: kept in the spec, checked against the model)."""
    return {"index_kpool": getattr(config.get_text_config(), "index_kpool", None)}


def kept_counts(spec, host: dict) -> dict:
    """The kept pools' prefix length of a forward without earlier tokens (``PlanHooks.fields``), found once per plan
    from the host mask (all keys valid without one); none where the pools kept need not be a prefix."""
    kpool = spec.value("index_kpool")
    ids, mask = host.get("input_ids"), host.get("attention_mask")
    if not isinstance(kpool, int) or kpool <= 0 or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return {}
    valid = np.ones(tuple(ids.shape), dtype=bool) if mask is None else np.asarray(mask.numpy(), dtype=bool)
    length = kept_prefix(valid, kpool) if valid.shape == tuple(ids.shape) else None
    return {} if length is None else {"family_counts": {KEPT: length, _ANY_KEPT: length > 0}}


def _traced_kept(pool_valid: torch.Tensor, valid_keys: torch.Tensor, kpool: int):
    """``kept_pools`` in a traced forward: the plan's prefix where the pooled states are exactly the batch's tokens
    (a length the graph is specialised on, as on the batch's width)."""
    entry = active.current()
    length = None if entry is None else entry.plan.family_counts.get(KEPT)
    if length is None or kpool != entry.plan.spec.value("index_kpool") or valid_keys.dim() != 2 \
            or tuple(valid_keys.shape) != tuple(entry.plan.batch_shape) or length > pool_valid.shape[1]:
        return pool_valid.any(0)
    return torch.arange(length, device=pool_valid.device)


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


@torch.library.custom_op("syncfree::glm5next_pooled_states", mutates_args=())
def _pooled(packed_states: torch.Tensor, kept: torch.Tensor, kpool: int, indexer: int) -> tuple[torch.Tensor,
                                                                                               torch.Tensor,
                                                                                               torch.Tensor]:
    _local.kept = kept.shape[0]  # (kept_pools takes it: the plan's prefix, measured on its host mask)
    try:
        return tuple(t.contiguous() for t in keyed(indexer).get_pooled_states(packed_states=packed_states))
    finally:
        _local.kept = None


@_pooled.register_fake
def _(packed_states, kept, kpool, indexer):
    # (the packed states are the keys, their gate scores (as wide) and the valid channel)
    batch, pools, width = packed_states.shape[0], kept.shape[0], (packed_states.shape[-1] - 1) // 2
    return (packed_states.new_empty((batch, pools, width)),
            packed_states.new_empty((batch, pools, kpool), dtype=torch.long),
            packed_states.new_empty((batch, pools), dtype=torch.bool))


def pooled_states(indexer, packed_states: torch.Tensor, valid_keys: torch.Tensor):
    """``indexer.get_pooled_states(packed_states=packed_states)``; in a traced forward of a stream whose states are
    exactly the batch's tokens, one operator (``syncfree::glm5next_pooled_states``) that runs it with the plan's kept
    prefix, a size of the graph (``Plan.carriers``): the number of pools, ``ceil(tokens / kpool)``, never reaches the
    graph, which would otherwise guard on its being 1 (texts of up to ``kpool`` tokens) and on the kept count."""
    entry = active.current() if torch.compiler.is_compiling() else None
    layout = None if entry is None else layout_of(entry.plan.spec.model_type)
    carrier = None if layout is None or not layout.stream else entry.plan.carriers.get(KEPT)
    if (carrier is None or valid_keys.dim() != 2 or indexer.index_kpool != entry.plan.spec.value("index_kpool")
            or tuple(valid_keys.shape) != entry.plan.shape):
        return indexer.get_pooled_states(packed_states=packed_states)
    if not entry.plan.family_counts.get(_ANY_KEPT):
        # (no pool kept, the longest text being shorter than a pool: an empty prefix, a constant of the graph; a
        # graph of its own, as the size below is at least 1)
        return _pooled(packed_states, packed_states.new_empty((0, 0)), indexer.index_kpool, key_of(indexer))
    # (at least one pool kept: what Inductor's matmul over the pools needs to know of the size)
    torch._check(carrier.shape[0] >= 1)
    return _pooled(packed_states, carrier, indexer.index_kpool, key_of(indexer))


def kept_pools(pool_valid: torch.Tensor, packed_states: torch.Tensor, valid_keys: torch.Tensor, kpool: int):
    """``pool_valid.any(0)`` (the pools to keep), or, where the host knows they are a prefix, the index of that
    prefix on the device: ``x[:, index]`` then holds what ``x[:, pool_valid.any(0)]`` holds."""
    # (a traced forward never reads the thread's state, which its graph would guard on)
    if torch.compiler.is_compiling():
        return _traced_kept(pool_valid, valid_keys, kpool)
    # (inside the stream's operator, which runs eagerly: the plan's prefix)
    kept = getattr(_local, "kept", None)
    if kept is not None:
        return torch.arange(kept, device=pool_valid.device)
    entry = active.current()
    own = None if entry is None else _own_tokens(packed_states)
    host = None if own is None or valid_keys.dim() != 2 else _host_valid_keys(entry, valid_keys, own)
    length = None if host is None or host.shape != tuple(valid_keys.shape) else kept_prefix(host, kpool)
    if length is None or length > pool_valid.shape[1]:
        return pool_valid.any(0)
    return torch.arange(length, device=pool_valid.device)
