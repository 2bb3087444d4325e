"""Helpers for a MoE block that routes text and vision tokens to separate experts (ERNIE-4.5-VL), and for host
index tensors stock code builds and moves to the device.

Stock asks ``moe_mm_token_type_ids.any()`` (a read of the device) and then moves each kind's rows in and out
of its experts with boolean masks expanded over the hidden width (``x[mask]``, ``x[mask] = y``: each reads
the number of true values from the device, and their backward passes do too). With the plan's host copy of
``moe_mm_token_type_ids`` the answer and the counts are known on the host: the rows are found once per
forward with ``torch.nonzero_static`` (an output size given: no read) and moved with ``index_select`` /
``index_copy_``, which copy the same values in the same order (row-major, as boolean indexing walks them).
Text and vision rows never overlap, so every row of the result is written exactly once, as in stock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..plan import active
from ..plan.tensors import host_array

__all__ = ["ModalityRows", "modality_rows", "any_vision_token", "experts_by_modality", "host_index_to"]

_MEMO_KEY = "modality_rows"


@dataclass(frozen=True)
class ModalityRows:
    """The flattened (batch * sequence) positions of the text tokens and of the vision tokens, on the device."""

    text: torch.Tensor
    vision: torch.Tensor


def _host_types(moe_mm_token_type_ids) -> tuple[active.Entry, np.ndarray] | None:
    """The active plan's host copy of ``moe_mm_token_type_ids`` when the tensor is the very one it was made for."""
    if torch.compiler.is_compiling() or not isinstance(moe_mm_token_type_ids, torch.Tensor):
        return None
    entry = active.current()
    if entry is None or entry.given.get("moe_mm_token_type_ids") is not moe_mm_token_type_ids:
        return None
    host = entry.plan.host.get("moe_mm_token_type_ids")
    if not isinstance(host, torch.Tensor) or host.shape != moe_mm_token_type_ids.shape:
        return None
    return entry, host_array(host)


def any_vision_token(moe_mm_token_type_ids):
    """``moe_mm_token_type_ids.any()``: a host bool from the plan's copy where there is one."""
    found = _host_types(moe_mm_token_type_ids)
    if found is None:
        return moe_mm_token_type_ids.any()
    return bool(found[1].any())


def modality_rows(moe_mm_token_type_ids) -> ModalityRows | None:
    """The positions of the text tokens (type 0) and of the vision tokens (any other type) of the running forward,
    made on the device once per forward (every MoE layer shares them), or None without a plan for this tensor."""
    found = _host_types(moe_mm_token_type_ids)
    if found is None:
        return None
    entry, host = found
    rows = entry.memo.get(_MEMO_KEY)
    if rows is None:
        n_vision = int(np.count_nonzero(host))
        flat = moe_mm_token_type_ids.reshape(-1) != 0
        rows = ModalityRows(torch.nonzero_static(~flat, size=flat.shape[0] - n_vision).reshape(-1),
                            torch.nonzero_static(flat, size=n_vision).reshape(-1))
        entry.memo[_MEMO_KEY] = rows
    return rows


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


def host_index_to(index: torch.Tensor, device) -> torch.Tensor:
    """``index.to(device)`` for an index tensor stock just built on the host: through pinned memory and without
    blocking (the pinned block stays reserved until the copy is done), the same values. Anything else as stock."""
    if (isinstance(index, torch.Tensor) and index.device.type == "cpu" and torch.device(device).type == "cuda"
            and not torch.compiler.is_compiling()):
        return index.pin_memory().to(device, non_blocking=True)
    return index.to(device)
