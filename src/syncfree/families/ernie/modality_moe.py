"""ERNIE-4.5-VL's own rewrite helpers (its ``Family.helpers``): its MoE block, which routes text and vision tokens to
separate experts.

Stock asks ``moe_mm_token_type_ids.any()`` (a read of the device) and then moves each kind's rows in and out
of its experts with boolean masks expanded over the hidden width (``x[mask]``, ``x[mask] = y``: each reads
the number of true values from the device, and their backward passes do too). With the plan's host copy of
``moe_mm_token_type_ids`` the answer and the counts are known on the host: the rows are found once per
forward with ``torch.nonzero_static`` (an output size given: no read) and moved with ``index_select`` /
``index_copy_``, which copy the same values in the same order (row-major, as boolean indexing walks them).
Text and vision rows never overlap, so every row of the result is written exactly once, as in stock.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from ...plan import active
from ...plan.tensors import host_array

__all__ = ["ModalityRows", "modality_rows", "any_vision_token", "experts_by_modality", "modality_counts"]

_COUNT, _ANY = "moe_vision_tokens", "any_vision_token"
# (the count a stream's graph takes as a size: ``PlanHooks.sizes``)
MODALITY_SIZES = (_COUNT,)


@dataclass(frozen=True)
class ModalityRows:
    """The flattened (batch * sequence) positions of the text tokens and of the vision tokens, on the device."""

    text: torch.Tensor
    vision: torch.Tensor
    any_vision: bool


# The rows found for a ``moe_mm_token_type_ids`` tensor, kept while that tensor lives and is unchanged: every MoE
# layer of the forward shares them, and gradient checkpointing's recompute (which runs in the backward, after the
# forward and its plan are gone, with the very same tensor) must take the path the forward took, or it saves
# other tensors than the forward did and fails.
_found: dict[int, tuple[weakref.ref, int, ModalityRows]] = {}


def _forget(key: int):
    def drop(_ref, found=_found):
        found.pop(key, None)
    return drop


def modality_rows(moe_mm_token_type_ids) -> ModalityRows | None:
    """The positions of the text tokens (type 0) and of the vision tokens (any other type) of ``moe_mm_token_type_ids``,
    made on the device once for the tensor (in a traced forward, once per block: the graph holds them), or None where
    no plan describes it."""
    if torch.compiler.is_compiling():
        return _traced_rows(moe_mm_token_type_ids)
    if not isinstance(moe_mm_token_type_ids, torch.Tensor) or moe_mm_token_type_ids.is_inference():
        return None
    key, version = id(moe_mm_token_type_ids), moe_mm_token_type_ids._version
    kept = _found.get(key)
    if kept is not None and kept[0]() is moe_mm_token_type_ids and kept[1] == version:
        return kept[2]
    entry = active.current()
    if entry is None or entry.given.get("moe_mm_token_type_ids") is not moe_mm_token_type_ids:
        return None
    host = entry.plan.host.get("moe_mm_token_type_ids")
    n_vision = entry.plan.family_counts.get(_COUNT)
    if not isinstance(host, torch.Tensor) or host.shape != moe_mm_token_type_ids.shape or n_vision is None:
        return None
    # The count from the plan's host copy (the plan checked it is this tensor's values), the positions on the device.
    rows = _rows(moe_mm_token_type_ids, n_vision)
    _found[key] = (weakref.ref(moe_mm_token_type_ids, _forget(key)), version, rows)
    return rows


def _rows(moe_mm_token_type_ids: torch.Tensor, n_vision, any_vision: bool | None = None) -> ModalityRows:
    flat = moe_mm_token_type_ids.reshape(-1) != 0
    if any_vision is None:
        any_vision = n_vision > 0
    else:  # (a size of the graph: at most every token)
        torch._check(n_vision <= flat.shape[0])
    return ModalityRows(torch.nonzero_static(~flat, size=flat.shape[0] - n_vision).reshape(-1),
                        torch.nonzero_static(flat, size=n_vision).reshape(-1), any_vision)


def _traced_rows(moe_mm_token_type_ids) -> ModalityRows | None:
    """``modality_rows`` in a traced forward: for the forward's own tensor, by the plan's count (``modality_counts``),
    which the graph cannot take from the tensor. In a stream's graph the count is a size (its carrier's: a symbol, so
    one graph for every count), and whether there is any a bool of the plan's (fixed for a set of inputs)."""
    entry = active.current()
    if entry is None or entry.given.get("moe_mm_token_type_ids") is not moe_mm_token_type_ids:
        return None
    carrier = entry.plan.carriers.get(_COUNT)
    if carrier is not None:
        return _rows(moe_mm_token_type_ids, carrier.shape[0], entry.plan.family_counts[_ANY])
    n_vision = entry.plan.family_counts.get(_COUNT)
    return None if n_vision is None else _rows(moe_mm_token_type_ids, n_vision)


def modality_counts(spec, host: dict) -> dict:
    """The plan's count of vision tokens (nonzero types) of the host ``moe_mm_token_type_ids``, which the MoE blocks'
    positions are sized by (``PlanHooks.fields``: ``Plan.family_counts``), counted once per plan."""
    types = host.get("moe_mm_token_type_ids")
    if not isinstance(types, torch.Tensor):
        return {}
    count = int(np.count_nonzero(host_array(types)))
    return {"family_counts": {_COUNT: count, _ANY: count > 0}}


def any_vision_token(moe_mm_token_type_ids):
    """``moe_mm_token_type_ids.any()``: a host bool from the plan's copy where there is one."""
    rows = modality_rows(moe_mm_token_type_ids)
    return moe_mm_token_type_ids.any() if rows is None else rows.any_vision


def experts_by_modality(experts, hidden_states: torch.Tensor, states_mask: torch.Tensor, router_mask: torch.Tensor,
                        final_hidden_states: torch.Tensor, router_logits: torch.Tensor,
                        rows: torch.Tensor | None) -> None:
    """``final_hidden_states[states_mask], router_logits[router_mask] = experts(hidden_states[states_mask])``, by
    the planned ``rows`` of that kind where given (the experts take the same rows, in the same order)."""
    if rows is None or not final_hidden_states.is_contiguous():
        final_hidden_states[states_mask], router_logits[router_mask] = experts(hidden_states[states_mask])
        return
    width = hidden_states.shape[-1]
    out, logits = experts(hidden_states.reshape(-1, width).index_select(0, rows))
    final_hidden_states.view(-1, width).index_copy_(0, rows, out.view(-1, width))
    router_logits.index_copy_(0, rows, logits.view(-1, router_logits.shape[-1]))
