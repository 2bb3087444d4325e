"""Qwen4-Exp's QSA indexer in a traced forward of a stream (``Layout.stream``).

Stock's ``_select_tokens`` loops in Python over every (row, query) of the batch, each visible-key count sizing that
query's pooled blocks, ``topk`` and written slice: Dynamo unrolls the loop with each count a constant, so every
layout compiles a graph of its own, growing with the text. In a traced stream forward, where the indexer's mask is
the forward's own (noted with the plan's counts, ``qsa._note_traced``), the call runs inside one operator
(``syncfree::qsa_select_tokens``) instead: it takes the plan's counts as a (rows, tokens) host table (reading it
waits for no device), keeps them for the mask it is handed (``qsa.visible_positions`` then finds them, as in an eager
prefill) and calls the indexer's own ``_select_tokens``: the same ops in the same order, so the selection is the eager
one bit for bit. Its output is a boolean mask: no gradient flows through it (stock's neither), so the operator needs
no backward.

Anything else (a cache holding earlier tokens, a mask the caller passed, an eager forward) calls ``_select_tokens``
as it is. The edit that routes the indexer's call through here is ``edits.QSA_SELECT``.
"""

from __future__ import annotations

import torch

from ...plan import active
from ...plan.spec import layout_of
from ...rewrite.op_keys import key_of, keyed
from .qsa import PLANNED_TABLE, keep_counts

__all__ = ["select_tokens"]


@torch.library.custom_op("syncfree::qsa_select_tokens", mutates_args=())
def _selected(hidden_states: torch.Tensor, q: torch.Tensor, raw_keys: torch.Tensor, full_cos: torch.Tensor,
              full_sin: torch.Tensor, attention_mask: torch.Tensor, counts: torch.Tensor, indexer: int) -> torch.Tensor:
    keep_counts(attention_mask, counts.tolist())
    selected = keyed(indexer)._select_tokens(hidden_states, q, raw_keys, full_cos, full_sin, attention_mask)
    return selected.contiguous()  # (stock's is a slice of a wider mask: the same values, laid out as the fake says)


@_selected.register_fake
def _(hidden_states, q, raw_keys, full_cos, full_sin, attention_mask, counts, indexer):
    return attention_mask.new_empty((hidden_states.shape[0], 1, hidden_states.shape[1], attention_mask.shape[-1]),
                                    dtype=torch.bool)


def select_tokens(indexer, hidden_states: torch.Tensor, q: torch.Tensor, raw_keys: torch.Tensor,
                  full_cos: torch.Tensor, full_sin: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
    """``indexer._select_tokens(...)`` (the call stock's ``forward`` makes); in a traced forward of a stream, on the
    forward's own mask, one operator over the plan's host counts."""
    entry = active.current() if torch.compiler.is_compiling() else None
    layout = None if entry is None else layout_of(entry.plan.spec.model_type)
    table = None if layout is None or not layout.stream else entry.plan.family_counts.get(PLANNED_TABLE)
    if table is None or entry.known(attention_mask) is None:
        return indexer._select_tokens(hidden_states, q, raw_keys, full_cos, full_sin, attention_mask, **kwargs)
    return _selected(hidden_states, q, raw_keys, full_cos, full_sin, attention_mask, table, key_of(indexer))
