"""Qwen4-Exp's own rewrite helpers (its ``Family.helpers``): its QSA token indexer's visible keys per query without
reading their number.

For every (row, query) stock takes ``torch.nonzero`` of that query's row of the causal mask: the positions of
the keys it sees, whose number then sizes every later shape (the blocks it pools, the ``topk``, the slice it
writes), so each call waits for the device. That mask is ``create_causal_mask``'s, built from the forward's 2D
padding mask: query ``i`` (at position ``q_offset + i``) sees key ``j`` where ``j <= q_offset + i`` and the
padding mask keeps ``j``. With the host copy of that padding mask (the plan's, extended with ones in a decode step
as ``generate()`` extends it) each count is a prefix sum on the host. The positions themselves still come from the
device row, by ``torch.nonzero_static`` with that count: the same values in the same order (``nonzero`` is
row-major), so every later stock op sees exactly the tensor it saw before.

The counts are made once per mask, when the text model makes it (``indexed_causal_mask``), and kept while that
mask tensor lives and is unchanged: every indexed layer of the forward shares them, and gradient checkpointing's
recompute (in the backward, after the plan is gone) hands the layers the very same tensor. A mask syncfree did not
see made (a 4D or per-layer mask the caller passed, packed sequences, no plan, a cache whose query offset lives on
the device outside ``generate()``) keeps stock's ``nonzero``: one read per (row, query), as stock.

A traced forward cannot walk a host mask, so the plan makes the counts of a forward without earlier tokens once,
when it is built from a 2D padding mask (``planned_counts``, its ``PlanHooks.fields``: ``Plan.family_counts``); the
eager prefill takes the same. The traced text model's mask made from the forward's own padding mask with no earlier
tokens is noted with them (``Entry.note``), and each indexer finds them by that mask's identity. In a stream's
traced forward the indexer's selection on that mask is one operator over the same counts as a host table
(``stream.py``); elsewhere the graph follows stock's loop over every (row, query), each count a constant of it: one
graph per layout.
"""

from __future__ import annotations

import functools
import weakref

import numpy as np
import torch

from ...plan import active
from ...rewrite.host_mask import host_padding_mask
from ...rewrite.roles import wrapper

__all__ = ["indexed_causal_mask", "visible_positions", "visible_counts", "make_generation_masks", "planned_counts"]

_PLANNED = "qsa_visible_counts"  # (Plan.family_counts: every (row, query)'s count, no earlier tokens)
# (the same counts as a (rows, tokens) host table: what a stream's traced forward hands its indexers' operator,
# ``stream.py``; marked like the batch's token dimensions, so a new layout is no new graph)
PLANNED_TABLE = "qsa_visible_count_table"

# What the text model passes create_causal_mask: any other argument (an extra mask function, block ids) changes the
# mask, so the counts are not made for it.
_PLAIN_KWARGS = {"config", "inputs_embeds", "attention_mask", "cache", "position_ids", "allow_is_causal_skip"}

# mask id -> (weakref to the mask, its version (None for an inference tensor), counts[b][i])
_counts: dict[int, tuple[weakref.ref, int | None, list[list[int]]]] = {}


def _forget(key: int):
    def drop(_ref, counts=_counts):
        counts.pop(key, None)
    return drop


def _version(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else t._version


def indexed_causal_mask(create_causal_mask, mask_kwargs: dict):
    """``create_causal_mask(**mask_kwargs)``; where the active plan knows the 2D padding mask it is made from,
    the number of keys each (row, query) of it sees is kept for the QSA indexers (``visible_positions``)."""
    mask = create_causal_mask(**mask_kwargs)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return mask
    if torch.compiler.is_compiling():
        _note_traced(mask_kwargs, mask)
        return mask
    counts = _planned_counts(mask_kwargs, mask)
    if counts is not None:
        keep_counts(mask, counts)
    return mask


def planned_counts(spec, host: dict) -> dict:
    """Every (row, query)'s number of visible keys in a forward without earlier tokens, from the host 2D padding mask
    (``PlanHooks.fields``), made once per plan; none without a mask (stock then looks for packed sequences)."""
    padding = host.get("attention_mask")
    if not isinstance(padding, torch.Tensor) or padding.dim() != 2:
        return {}
    width = padding.shape[1]
    counts = visible_counts(padding.numpy() != 0, 0, width, width)
    return {"family_counts": {_PLANNED: counts, PLANNED_TABLE: torch.tensor(counts, dtype=torch.int64)}}


def _plain_call(entry, mask_kwargs: dict) -> bool:
    """The text model's own call on the forward's own 2D padding mask, of the batch's shape (what the plan's counts
    describe, cache aside)."""
    config, embeds, padding = mask_kwargs.get("config"), mask_kwargs.get("inputs_embeds"), mask_kwargs.get("attention_mask")
    return (entry is not None and not set(mask_kwargs) - _PLAIN_KWARGS and getattr(config, "is_causal", True)
            and getattr(config, "_attn_implementation", None) in ("sdpa", "eager")
            and isinstance(embeds, torch.Tensor) and embeds.dim() == 3
            and isinstance(padding, torch.Tensor) and entry.given.get("attention_mask") is padding
            and tuple(padding.shape) == entry.plan.shape == tuple(embeds.shape[:2]))


def _note_traced(mask_kwargs: dict, mask: torch.Tensor) -> None:
    """In a traced forward: note ``mask`` with the plan's counts where it is the mask of the forward's own tokens and
    no earlier ones (no cache, or an empty one whose mask sizes are the batch's, as host ints)."""
    entry = active.current()
    counts = None if entry is None else entry.plan.family_counts.get(_PLANNED)
    if counts is None or not _plain_call(entry, mask_kwargs):
        return
    batch, width = entry.plan.shape  # (sizes a stream's graph keeps symbolic)
    cache = mask_kwargs.get("cache")
    if cache is not None:
        from transformers.masking_utils import find_first_full_attention_index

        layer = find_first_full_attention_index(cache)
        sizes, offset = cache.get_mask_sizes(width, layer), cache.get_query_offset(layer)
        # (host ints, or in a stream's graph the width's own symbol: an empty cache's sizes are the call's)
        if not (isinstance(offset, int) and offset == 0 and all(isinstance(n, (int, torch.SymInt)) for n in sizes)
                and tuple(sizes) == (width, 0)):
            return
    if tuple(mask.shape) == (batch, 1, width, width):
        entry.note(mask, None, counts)


def keep_counts(mask: torch.Tensor, counts: list[list[int]]) -> None:
    """Keep ``counts`` (every (row, query)'s) for ``mask``, while it lives unchanged (``visible_positions``)."""
    key = id(mask)
    _counts[key] = (weakref.ref(mask, _forget(key)), _version(mask), counts)


@wrapper("keeps the counts of the indexed layers' masks generate() makes itself")
def make_generation_masks(stock):
    """``prepare_inputs_for_generation`` that also keeps the counts for the indexed layers' mask ``generate()``
    makes itself (with a static cache it builds every layer type's mask before the forward, from the 2D padding
    mask it keeps growing: the mask the text model then takes as given)."""

    @functools.wraps(stock)
    def prepare_inputs_for_generation(self, *args, **kwargs):
        inputs = stock(self, *args, **kwargs)
        if not torch.compiler.is_compiling():
            _generation_counts(inputs, kwargs.get("attention_mask"))
        return inputs

    return prepare_inputs_for_generation


def _generation_counts(inputs, padding) -> None:
    entry = active.generating()
    masks = inputs.get("attention_mask") if hasattr(inputs, "get") else None
    mask = masks.get("indexed_attention") if isinstance(masks, dict) else None
    cache = inputs.get("cache", inputs.get("past_key_values"))
    if (entry is None or not isinstance(mask, torch.Tensor) or mask.dim() != 4 or not isinstance(padding, torch.Tensor)
            or padding.dim() != 2 or cache is None or not getattr(cache, "is_compileable", False)):
        return
    from transformers.masking_utils import find_first_full_attention_index

    batch, q_length, kv_length = mask.shape[0], mask.shape[2], mask.shape[3]
    host = host_padding_mask(entry, padding)
    if (host is None or tuple(host.shape) != tuple(padding.shape) or padding.shape[0] != batch
            or host.shape[1] < q_length
            or tuple(cache.get_mask_sizes(q_length, find_first_full_attention_index(cache))) != (kv_length, 0)):
        return
    # generate() grows the padding mask by one column per token: it covers the cached tokens and this step's.
    keep_counts(mask, visible_counts(host.detach().numpy() != 0, host.shape[1] - q_length, q_length, kv_length))


def _planned_counts(mask_kwargs: dict, mask: torch.Tensor) -> list[list[int]] | None:
    from transformers.masking_utils import find_first_full_attention_index  # (a stock helper; no device read)

    entry = active.current()
    config, embeds = mask_kwargs.get("config"), mask_kwargs.get("inputs_embeds")
    padding, cache = mask_kwargs.get("attention_mask"), mask_kwargs.get("cache")
    if (entry is None or set(mask_kwargs) - _PLAIN_KWARGS or not getattr(config, "is_causal", True)
            or getattr(config, "_attn_implementation", None) not in ("sdpa", "eager")
            or not isinstance(embeds, torch.Tensor) or embeds.dim() != 3):
        return None
    batch, q_length = embeds.shape[:2]
    if cache is not None:
        layer = find_first_full_attention_index(cache)
        kv_length, kv_offset = cache.get_mask_sizes(q_length, layer)
        q_offset = cache.get_query_offset(layer)
    elif isinstance(padding, torch.Tensor):
        kv_length, kv_offset, q_offset = padding.shape[-1], 0, 0
    else:
        return None  # no mask and no cache: stock looks for packed sequences in the position ids
    if isinstance(padding, torch.Tensor):
        if padding.dim() != 2 or padding.shape[0] != batch:
            return None
        host = host_padding_mask(entry, padding)
        if host is None or tuple(host.shape) != tuple(padding.shape):
            return None
        host = host.detach().numpy() != 0
    else:
        if padding is not None or not isinstance(q_offset, int):
            return None
        host = np.ones((batch, q_offset + q_length), dtype=bool)
    if not isinstance(q_offset, int):
        # A static cache keeps its length on the device. Inside generate() the padding mask covers exactly the
        # tokens seen so far and this step's, as generate() grows it (host_padding_mask relies on that too).
        if not entry.in_generate:
            return None
        q_offset = host.shape[1] - q_length
    if kv_offset != 0 or tuple(mask.shape) != (batch, 1, q_length, kv_length):
        return None
    planned = entry.plan.family_counts.get(_PLANNED)
    if planned is not None and q_offset == 0 and q_length == kv_length and _plain_call(entry, mask_kwargs):
        return planned  # (the plan's own counts of this very mask: made once, when it was built)
    return visible_counts(host, q_offset, q_length, kv_length)


def visible_counts(host: np.ndarray, q_offset: int, q_length: int, kv_length: int) -> list[list[int]]:
    """For a (B, W) host padding mask, the number of keys query ``i < q_length`` of each row sees in the causal mask
    ``create_causal_mask`` makes from it: keys ``j < kv_length`` with ``j <= q_offset + i`` and ``host[b, j]``
    (stock pads the padding mask with zeros past W)."""
    batch, width = host.shape
    prefix = np.concatenate([np.zeros((batch, 1), dtype=np.int64), np.cumsum(host, axis=1, dtype=np.int64)], axis=1)
    ends = np.clip(np.arange(q_offset + 1, q_offset + 1 + q_length), 0, min(kv_length, width))
    return prefix[:, ends].tolist()


def visible_positions(row: torch.Tensor, mask: torch.Tensor, batch_idx: int, query_idx: int) -> torch.Tensor:
    """``torch.nonzero(row, as_tuple=False)`` for ``row``, the visible keys of query ``query_idx`` of row
    ``batch_idx`` of ``mask`` (the QSA indexer's causal mask): with the count kept for that mask, ``nonzero_static``
    (the same positions, no read of their number); otherwise stock's ``nonzero``."""
    if torch.compiler.is_compiling():
        entry = active.current()
        known = None if entry is None or row.dim() != 1 else entry.known(mask)
        if known is None:
            return torch.nonzero(row, as_tuple=False)
        return torch.nonzero_static(row, size=known[1][batch_idx][query_idx])
    kept = _counts.get(id(mask))
    if kept is None or kept[0]() is not mask or kept[1] != _version(mask) or row.dim() != 1:
        return torch.nonzero(row, as_tuple=False)
    return torch.nonzero_static(row, size=kept[2][batch_idx][query_idx])
