"""The stock lines syncfree rewrites in GLM-5-Next's text model: its pooled DSA indexer's kept pools.

Its edits call the family's own helpers (``pooled_keep.py``, its ``Family.helpers``) under ``_syncfree``.
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["POOLED_WRITTEN", "POOLED_KEEP", "POOL_BUDGET", "KDA_CHUNKS"]

# GLM-5-Next's pooled DSA indexer keeps the pools some row can use with a boolean select (a read of their number);
# where the plan's host mask shows they are a prefix, by an index of that length (``pooled_keep.py``). The
# indexer's forward says first whether every slot of the states it pools is a written token (no static cache
# still filling): POOLED_WRITTEN is the forward's edit, POOLED_KEEP get_pooled_states'.
POOLED_WRITTEN = (
    Edit("stmt", "pool_keys, pool_indices, pool_valid = self.get_pooled_states(packed_states=packed_states)",
         "_syncfree.pools_written(packed_states, seq_len, kv_len, current_length)\n"
         "pool_keys, pool_indices, pool_valid = _syncfree.pooled_states(self, packed_states, valid_keys)"),
)
POOLED_KEEP = (
    Edit("expr", "pool_valid.any(0)", "_syncfree.kept_pools(pool_valid, packed_states, valid_keys, self.index_kpool)"),
)
# The indexer's budget of pools, ``min(topk // kpool, pools)``: in a stream's traced forward the kept pools are a size
# the graph keeps symbolic, which Python's ``min`` would guard on (the shared ``size_min``).
POOL_BUDGET = (
    Edit("expr", "min(self.index_topk // self.index_kpool, index_scores.shape[-1])",
         "_syncfree.size_min(self.index_topk // self.index_kpool, index_scores.shape[-1])"),
)
# Its KDA layers scan their chunked delta rule in a Python loop over 64-token chunks, as Qwen3.5's gated-DeltaNet
# layers do, with the same arguments: in a traced stream forward one operator (``rewrite/chunk_delta_rule.py``).
KDA_CHUNKS = (
    Edit("expr", "chunk_kimi_delta_attention", "_syncfree.chunk_delta_rule(chunk_kimi_delta_attention)"),
)
