"""The rule table: which ops make the host wait for a CUDA device, and why.

Each rule names an aten op (or, for the few calls that never reach the aten
dispatcher, a Python API), says whether it syncs, under which condition, and
the reason. The emulated engine applies these rules; the ``NO_SYNC`` entries
are the documented negative cases, kept here so the table reads as the whole
story and so tests can walk both lists.

Copies between host and device are not in this table: the emulator sees them
directly (``aten::_to_copy``, ``aten::copy_`` across devices, ``torch.tensor``
with ``device="cuda"``) and records their direction, size, and whether they
were blocking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["Rule", "SYNC_RULES", "NO_SYNC", "PYTHON_SYNC_RULES", "sync_reason"]


def _is_device(t: Any) -> bool:
    # Set by emulate.py: the type of an emulated device tensor.
    return _device_tensor_type is not None and isinstance(t, _device_tensor_type)


_device_tensor_type: type | None = None


def _bool_index_on_device(args: tuple, kwargs: dict) -> bool:
    # index.Tensor(self, indices) / index_put_(self, indices, values, ...): a boolean
    # index is expanded with nonzero(), whose output size is the number of true values.
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return any(
        i is not None and i.dtype in (torch.bool, torch.uint8) and _is_device(i) for i in indices
    )


def _index_put_syncs(args: tuple, kwargs: dict) -> bool:
    # x[mask] = value: CUDA first tries masked_fill_, which needs no host read. It can when
    # the value is one element on the CPU (a Python scalar arrives as a 0-dim CPU tensor),
    # nothing is accumulated, and the only index is one boolean mask on the device.
    if not _bool_index_on_device(args, kwargs):
        return False
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    value = args[2] if len(args) > 2 else kwargs.get("values")
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    defined = [i for i in indices if i is not None]
    masked_fill_route = (
        not accumulate
        and value is not None
        and not _is_device(value)
        and value.numel() == 1
        and len(defined) == 1
    )
    return not masked_fill_route


def _no_output_size(args: tuple, kwargs: dict) -> bool:
    return kwargs.get("output_size") is None


def _histc_range_from_data(args: tuple, kwargs: dict) -> bool:
    lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
    hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
    return lo == hi


def _grouped_mm_fallback(args: tuple, kwargs: dict) -> bool:
    # CUDA's fast path (on compute capability 9.0/10.0, as emulated) takes bfloat16 operands and
    # output only; anything else goes to a fallback that copies the offsets to the host and loops
    # over the groups. Without offsets (3d x 3d) the fallback is a plain bmm.
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    out_dtype = args[4] if len(args) > 4 else kwargs.get("out_dtype")
    bf16 = a.dtype == b.dtype == torch.bfloat16 and out_dtype in (None, torch.bfloat16)
    return offs is not None and not bf16


@dataclass(frozen=True)
class Rule:
    """One op that syncs (``when`` is None: always; else only when ``when(args, kwargs)``)."""

    op: str
    reason: str
    when: Callable[[tuple, dict], bool] | None = None
    condition: str = "always"


SYNC_RULES: dict[str, Rule] = {
    r.op: r
    for r in (
        Rule("aten::_local_scalar_dense",
             "reads one element back to the host: .item(), int(), float(), bool(), __index__, `if t:`, "
             "Python max()/min() of tensors, a tensor used as a size or a Python number"),
        Rule("aten::nonzero", "the output size is the number of non-zero elements, which the host must read"),
        Rule("aten::masked_select", "the output size is the number of true mask elements, read on the host"),
        Rule("aten::index.Tensor", "boolean-mask indexing x[mask] expands the mask with nonzero()",
             _bool_index_on_device, "an index is a boolean/uint8 tensor on the device"),
        Rule("aten::index_put_", "x[mask] = tensor expands the boolean mask with nonzero()",
             _index_put_syncs, "a boolean/uint8 index on the device, unless the masked_fill_ route applies "
             "(one mask, a one-element host value such as a Python scalar, no accumulate)"),
        Rule("aten::_index_put_impl_", "x[mask] = tensor expands the boolean mask with nonzero()",
             _index_put_syncs, "as aten::index_put_"),
        Rule("aten::index_put", "a boolean mask is expanded with nonzero() (also the backward of x[mask], "
             "which accumulates the gradient into zeros through the mask)", _index_put_syncs, "as aten::index_put_"),
        Rule("aten::masked_scatter_backward",
             "the gradient of masked_scatter's source is grad.masked_select(mask), whose output size is read "
             "on the host (ATen's masked_scatter_backward_symint)"),
        Rule("aten::_unique", "the number of unique values is data-dependent, read on the host"),
        Rule("aten::_unique2", "the number of unique values is data-dependent, read on the host"),
        Rule("aten::unique_dim", "the number of unique values is data-dependent, read on the host"),
        Rule("aten::unique_consecutive", "the number of runs is data-dependent, read on the host"),
        Rule("aten::unique_dim_consecutive", "the number of runs is data-dependent, read on the host"),
        Rule("aten::repeat_interleave.Tensor",
             "without output_size the output length is repeats.sum(), read on the host",
             _no_output_size, "output_size is not given"),
        Rule("aten::bincount", "the output length is input.max() + 1, read on the host"),
        Rule("aten::histc", "with min == max the range is taken from the data with a host read",
             _histc_range_from_data, "min == max (the default 0, 0)"),
        Rule("aten::equal", "returns a Python bool, read on the host"),
        Rule("aten::_grouped_mm", "outside its bfloat16 fast path, CUDA's grouped matmul (MoE experts) copies "
             "the group offsets to the host to loop over the groups", _grouped_mm_fallback,
             "offsets given, and an operand or the output not bfloat16 "
             "(GPUs older than sm_90 always take the fallback)"),
    )
}

# Python-level calls that never reach the aten dispatcher as a syncing op.
PYTHON_SYNC_RULES: dict[str, str] = {
    "Tensor.tolist": "copies every element to a Python list on the host",
    "Tensor.__repr__": "printing or formatting a device tensor (also f\"{t}\") reads its values on the host",
    "torch.tensor": "torch.tensor/as_tensor/new_tensor of a list holding device tensors reads each element "
    "on the host",
    "torch.cuda.synchronize": "waits for all queued work on the device",
}

# Ops that look like they might sync but do not (the negative cases).
NO_SYNC: dict[str, str] = {
    "aten::masked_fill_": "a kernel, no host read",
    "aten::index_put_ (x[mask] = python_scalar)": "dispatches to masked_fill_: no host read",
    "aten::masked_scatter": "its size check runs as an asynchronous device kernel",
    "aten::masked_scatter_": "its size check runs as an asynchronous device kernel",
    "aten::cumsum": "a device kernel with a known output size",
    "aten::searchsorted": "a device kernel with a known output size",
    "aten::index_select": "integer indices: known output size",
    "aten::index_copy_": "integer indices: known output size",
    "aten::index_add_": "integer indices: known output size",
    "aten::scatter_": "known output size",
    "aten::gather": "known output size",
    "aten::nonzero_static": "the output size is given by the caller",
    "aten::repeat_interleave.Tensor (output_size=n)": "the output length is the host int n",
    "aten::_grouped_mm (bfloat16)": "the sm_90 fast path takes the offsets on the device",
    "aten::embedding_dense_backward": "up to 3072 indices an atomic kernel; past that a sort and segment "
    "reduction whose segment count stays on the device (kernels are sized by min(indices, rows)): no host "
    "read either way",
    "aten::nll_loss_forward (ignore_index, mean)": "the count of non-ignored targets (total_weight) is computed "
    "and divided by on the device",
    "aten::nll_loss_backward": "a kernel that reads total_weight on the device",
    "aten::masked_select_backward": "zeros_like(input).masked_scatter_(mask, grad): no host read",
    "aten::index_select_backward / aten::index_add_": "integer indices: known output size",
}


def sync_reason(op_name: str, args: tuple, kwargs: dict) -> str | None:
    """The reason ``op_name`` called with these (unwrapped-device-aware) args syncs, or None."""
    rule = SYNC_RULES.get(op_name) or SYNC_RULES.get(op_name.split(".")[0])
    if rule is None:
        return None
    if rule.when is not None and not rule.when(args, kwargs):
        return None
    return rule.reason
