"""Which aten ops on the emulated device stand for a kernel launch on CUDA.

With the host syncs gone, what the host still pays per forward is launches. The emulated device
counts every aten op it runs on device data except those that launch nothing on CUDA: views and
aliases (they only make a new tensor header), allocations without a fill, and metadata queries.
Ops that PyTorch decomposes in C++ before they reach the dispatcher are counted as their parts
(``linear`` as ``t`` (a view) and ``addmm``), which is also how CUDA runs them; a library call that
launches more than one kernel internally (some cuBLAS or flash-attention paths) counts as one.
Copies between host and device are memcpys, counted with the copies, not here.
"""

from __future__ import annotations

__all__ = ["is_launch"]

# Ops that run on device tensors but put no kernel on the stream.
_NO_KERNEL = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::detach", "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::lift_fresh_copy", "aten::set_",
    "aten::resize_", "aten::is_pinned", "aten::is_same_size", "aten::is_nonzero", "aten::result_type",
    "aten::_has_compatible_shallow_copy_type", "aten::record_stream", "aten::_local_scalar_dense",
    "aten::_to_copy", "aten::copy_", "aten::_pin_memory",
})

_verdicts: dict[object, bool] = {}


def is_launch(func) -> bool:
    """True when the aten op ``func`` (an OpOverload) launches a kernel on CUDA."""
    verdict = _verdicts.get(func)
    if verdict is None:
        name = func.name()
        verdict = not getattr(func, "is_view", False) and name not in _NO_KERNEL and not name.startswith("aten::sym_")
        _verdicts[func] = verdict
    return verdict
