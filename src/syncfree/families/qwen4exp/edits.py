"""The stock lines syncfree rewrites in Qwen4-Exp's text model: its QSA indexer's visible keys per (row, query).

Each (row, query)'s visible key positions by ``nonzero_static`` with a count the host knows (``qsa.py``, the family's
own helpers): the text model keeps the counts for the causal mask it makes, the indexer asks for them.
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["QSA_MASK", "QSA_VISIBLE"]

QSA_MASK = (
    Edit("expr", "create_causal_mask(**mask_kwargs)", "_syncfree.indexed_causal_mask(create_causal_mask, mask_kwargs)"),
)
QSA_VISIBLE = (
    Edit("expr", "torch.nonzero(visible_token_indices[batch_idx, 0, query_idx], as_tuple=False)",
         "_syncfree.visible_positions(visible_token_indices[batch_idx, 0, query_idx], attention_mask, batch_idx, "
         "query_idx)"),
)
