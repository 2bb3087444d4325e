"""The emulated device's tensor and its event recorder (see ``emulate.py`` for the whole picture).

``DeviceTensor`` is a wrapper that reports ``device='cuda:0'`` and holds an ordinary CPU tensor;
``record`` sends one sync or copy event, with the phase and source line it belongs to, to every
audit listening on this thread.
"""

from __future__ import annotations

import threading

import torch

from . import rules
from .events import D2H, SYNC, Event, active_collectors
from .phases import locate

__all__ = ["DeviceTensor", "record", "current_api", "api_stack"]

_CUDA = torch.device("cuda", 0)
_CPU = torch.device("cpu")
_state = threading.local()


def api_stack() -> list[str]:
    if not hasattr(_state, "api"):
        _state.api = []
    return _state.api


def current_api() -> str | None:
    stack = api_stack()
    return stack[0] if stack else None


class DeviceTensor(torch.Tensor):
    """A tensor on the emulated CUDA device; ``elem`` holds its data on the CPU."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device = _CUDA) -> "DeviceTensor":
        assert type(elem) is torch.Tensor and elem.device.type == "cpu", type(elem)
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=device,
            requires_grad=elem.requires_grad,
        )
        out.elem = elem
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(
            f"{func} was called on a tensor of syncfree's emulated CUDA device outside "
            "`with syncfree.emulate_cuda():`; that device exists only inside the context."
        )

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return DeviceTensor(inner_tensors["elem"])

    def tolist(self):
        record(SYNC, "Tensor.tolist", rules.PYTHON_SYNC_RULES["Tensor.tolist"], self.elem, api="Tensor.tolist")
        return self.elem.tolist()

    def __repr__(self, *, tensor_contents=None):
        record(SYNC, "Tensor.__repr__", rules.PYTHON_SYNC_RULES["Tensor.__repr__"], self.elem,
               api=current_api() or "Tensor.__repr__")
        body = repr(self.elem)
        return body[:-1] + f", device='{self.device}')" if body.endswith(")") else body


rules._device_tensor_type = DeviceTensor


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def record(kind: str, op: str, reason: str, *tensors, nbytes: int | None = None, blocking: bool = True,
           pinned: bool | None = None, waits: bool | None = None, api: str | None = None) -> None:
    """Send one event to every active collector (cheap when none is active)."""
    collectors = active_collectors()
    if not collectors:
        return
    plain = [t.elem if isinstance(t, DeviceTensor) else t for t in tensors if isinstance(t, torch.Tensor)]
    phase, stack = locate()
    event = Event(
        kind=kind,
        op=op,
        reason=reason,
        api=api if api is not None else current_api(),
        shapes=tuple(tuple(t.shape) for t in plain),
        nbytes=sum(_nbytes(t) for t in plain) if nbytes is None else nbytes,
        blocking=blocking,
        pinned=pinned,
        waits=(kind == SYNC or (kind == D2H and blocking)) if waits is None else waits,
        engine="emulated",
        stack=stack,
        phase=phase,
    )
    for c in list(collectors):
        c.add(event)
