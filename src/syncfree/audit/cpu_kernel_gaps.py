"""What a CUDA kernel accepts and the CPU kernel of the same op does not, computed another way on the CPU.

The emulated device runs every op on the CPU. Where the CPU kernel lacks a dtype the CUDA
kernel takes, or (on older PyTorch) the CPU kernel does not exist at all, the op is computed
here with the same result. These run on plain CPU tensors inside the emulator's dispatch, so
nothing they do is recorded as a sync: they stand in for device kernels.
"""

from __future__ import annotations

import torch

__all__ = ["CPU_KERNEL_GAPS"]


def _histc_integer(func, args, kwargs):
    # CUDA's histc takes integer inputs (Transformers' MoE code counts tokens per expert that way on
    # CUDA); the CPU kernel does not. Counting in float64 gives the same counts.
    x = args[0]
    if x.dtype.is_floating_point:
        return func(*args, **kwargs)
    return func(x.double(), *args[1:], **kwargs).to(x.dtype)


def grouped_mm_by_groups(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype=None) -> torch.Tensor:
    """``_grouped_mm`` of a (tokens, K) matrix and (groups, K, N) weights: rows up to ``offs[g]`` use ``b[g]``."""
    out = torch.zeros(a.shape[0], b.shape[2], dtype=out_dtype or a.dtype)
    start = 0
    for g, end in enumerate(offs.tolist()):  # a plain CPU tensor here: the device kernel's own bookkeeping
        if end > start:
            torch.mm(a[start:end], b[g], out=out[start:end])
        start = end
    return out


def _grouped_mm(func, args, kwargs):
    # Transformers' MoE experts call torch._grouped_mm on a device of compute capability 9.0 (what
    # the emulator reports); PyTorch 2.8 and older have no CPU kernel for it.
    try:
        return func(*args, **kwargs)
    except NotImplementedError:
        a, b, offs = (list(args) + [kwargs.get("offs")])[:3]
        bias = args[3] if len(args) > 3 else kwargs.get("bias")
        if a.dim() != 2 or b.dim() != 3 or offs is None or bias is not None:
            raise
        return grouped_mm_by_groups(a, b, offs, args[4] if len(args) > 4 else kwargs.get("out_dtype"))


CPU_KERNEL_GAPS = {"aten::histc": _histc_integer, "aten::_grouped_mm": _grouped_mm}
