"""Copies between the host and the emulated device, and pinned host memory, judged as CUDA would.

The dispatch mode (``emulate.py``) hands ``_to_copy``, ``copy_``, ``is_pinned`` and ``_pin_memory``
to the handlers here: they record each copy's direction, size and whether the host waits for it,
and run the copy on the CPU.
"""

from __future__ import annotations

import weakref

import torch

from .device_tensor import DeviceTensor, record
from .events import D2H, H2D

__all__ = ["COPY_HANDLERS", "is_pinned", "device_of"]

_CPU = torch.device("cpu")


def device_of(value) -> torch.device | None:
    if value is None:
        return None
    return torch.device(value) if not isinstance(value, torch.device) else value


# ---- pinned host memory -------------------------------------------------------------------
# A CPU-only build cannot pin memory. We hand out ordinary CPU tensors and remember
# their storages as "pinned", so a later non_blocking copy can be judged as CUDA would.
_pinned: dict[int, weakref.ref] = {}


def _mark_pinned(t: torch.Tensor) -> torch.Tensor:
    storage = t.untyped_storage()
    key = storage.data_ptr()
    _pinned[key] = weakref.ref(t, lambda _r, k=key: _pinned.pop(k, None))
    return t


def is_pinned(t: torch.Tensor) -> bool:
    if isinstance(t, DeviceTensor) or t.device.type != "cpu" or t.numel() == 0:
        return False
    ref = _pinned.get(t.untyped_storage().data_ptr())
    return ref is not None and ref() is not None


def _to_copy(func, args, kwargs):
    (src,) = args
    target = device_of(kwargs.get("device"))
    non_blocking = bool(kwargs.get("non_blocking", False))
    kwargs = {**kwargs, "device": _CPU}
    kwargs.pop("pin_memory", None)
    if isinstance(src, DeviceTensor):
        if target is None or target.type == "cuda":
            return DeviceTensor(func(src.elem, **kwargs))
        if src.numel() == 0:  # CUDA skips the copy of an empty tensor
            return func(src.elem, **kwargs)
        # Device to host. A non_blocking copy to the CPU lands in pinned memory: no wait.
        record(D2H, func.name(), "a device-to-host copy (.cpu(), .to('cpu'), .numpy())", src,
               blocking=not non_blocking, pinned=non_blocking)
        out = func(src.elem, **kwargs)
        return _mark_pinned(out) if non_blocking else out
    if target is not None and target.type == "cuda":
        pinned = is_pinned(src)
        if src.numel():  # CUDA skips the copy of an empty tensor
                record(H2D, func.name(), "a host-to-device copy (.to('cuda'), .cuda())", src,
                   blocking=not (non_blocking and pinned), pinned=pinned)
        # Crossing devices always makes a new tensor, even when dtype and layout match.
        out = func(src, **kwargs)
        return DeviceTensor(out.clone() if out is src else out)
    return func(src, **kwargs)


def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    if dst.numel() == 0:  # CUDA skips the copy of an empty tensor
        func(dst.elem if isinstance(dst, DeviceTensor) else dst, src.elem if isinstance(src, DeviceTensor) else src)
        return dst
    if isinstance(dst, DeviceTensor) and not isinstance(src, DeviceTensor):
        pinned = is_pinned(src)
        record(H2D, func.name(), "a host-to-device copy into an existing device tensor", src,
               blocking=not (non_blocking and pinned), pinned=pinned)
        func(dst.elem, src, non_blocking)
        return dst
    if isinstance(src, DeviceTensor) and not isinstance(dst, DeviceTensor):
        pinned = is_pinned(dst)
        record(D2H, func.name(), "a device-to-host copy into an existing host tensor", src,
               blocking=not (non_blocking and pinned), pinned=pinned)
        func(dst, src.elem, non_blocking)
        return dst
    if isinstance(dst, DeviceTensor):
        func(dst.elem, src.elem, non_blocking)
        return dst
    return func(dst, src, non_blocking)


def _is_pinned(func, args, kwargs):
    return is_pinned(args[0])


def _pin_memory(func, args, kwargs):
    src = args[0]
    if isinstance(src, DeviceTensor):
        raise RuntimeError("cannot pin 'cuda:0' memory: only dense CPU tensors can be pinned (emulated CUDA)")
    return _mark_pinned(src.clone())


COPY_HANDLERS = {
    "aten::_to_copy": _to_copy,
    "aten::copy_": _copy_,
    "aten::is_pinned": _is_pinned,
    "aten::_pin_memory": _pin_memory,
}
