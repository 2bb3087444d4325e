"""The stock lines syncfree rewrites in Qwen4-Exp's text model: its QSA indexer's visible keys per (row, query).

Each (row, query)'s visible key positions by ``nonzero_static`` with a count the host knows (``qsa.py``, the family's
own helpers): the text model keeps the counts for the causal mask it makes, the indexer asks for them. In a traced
forward of a stream, the indexer's call of its selection goes through one operator (``stream.py``).
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["QSA_MASK", "QSA_VISIBLE", "QSA_SELECT"]

QSA_MASK = (
    Edit("expr", "create_causal_mask(**mask_kwargs)", "_syncfree.indexed_causal_mask(create_causal_mask, mask_kwargs)"),
)
QSA_VISIBLE = (
    Edit("expr", "torch.nonzero(visible_token_indices[batch_idx, 0, query_idx], as_tuple=False)",
         "_syncfree.visible_positions(visible_token_indices[batch_idx, 0, query_idx], attention_mask, batch_idx, "
         "query_idx)"),
)
# (in a traced forward of a stream, the indexer's whole selection one operator: ``stream.py``)
QSA_SELECT = (
    Edit("expr", "self._select_tokens(hidden_states, q, raw_keys, full_cos, full_sin, attention_mask, **kwargs)",
         "_syncfree.select_tokens(self, hidden_states, q, raw_keys, full_cos, full_sin, attention_mask, **kwargs)"),
)
