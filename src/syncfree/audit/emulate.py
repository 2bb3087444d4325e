"""An emulated CUDA device for CPU-only machines: runs on the CPU, records what CUDA would do.

Inside ``with emulate_cuda():`` (where ``torch.cuda`` answers as one sm_90 device, see
``cuda_standins.py``) a tensor put on ``"cuda"`` becomes a
``DeviceTensor``: a wrapper that reports ``device='cuda:0'`` and holds an
ordinary CPU tensor. Every aten op is seen by a ``TorchDispatchMode``, which
runs it on the held CPU tensors (so the numbers are bit for bit those of a
plain CPU run) and, when the op touches device data, applies the rule table
(``rules.py``) and records syncs and host/device copies with the source line
that caused them.

Four things make this work on a CPU-only PyTorch build:

* ``torch.cuda._lazy_init`` is what C++ calls before a factory such as
  ``torch.arange(n, device="cuda")`` reaches the dispatcher; we replace it with
  a no-op while emulating, so the call reaches our dispatch mode instead of
  failing with "Torch not compiled with CUDA enabled".
* Python bindings such as ``x[i]`` open a device guard for the tensor's device;
  ``guard_shim`` installs c10's header-only fake guard for CUDA.
* ``torch.tensor``/``as_tensor``/``new_tensor`` skip the Python dispatch layer,
  and ``F.scaled_dot_product_attention`` picks a kernel by device type before
  it reaches aten; a ``TorchFunctionMode`` handles those (``api_mode.py``).
* ``DeviceTensor`` implements the flatten protocol, so ``model.to("cuda")``
  swaps parameters in place and tied weights stay tied.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import rules
from .cpu_kernel_gaps import CPU_KERNEL_GAPS
from .cuda_standins import CUDA_STANDINS
from .events import D2H, H2D, SYNC, Event, active_collectors, capture_stack
from .guard_shim import FakeCudaGuard
from .launches import is_launch

__all__ = ["DeviceTensor", "emulate_cuda", "is_emulating", "real_cuda_available", "record"]

_CUDA = torch.device("cuda", 0)
_CPU = torch.device("cpu")
_state = threading.local()


def _api_stack() -> list[str]:
    if not hasattr(_state, "api"):
        _state.api = []
    return _state.api


def current_api() -> str | None:
    stack = _api_stack()
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
        stack=capture_stack(),
    )
    for c in list(collectors):
        c.add(event)


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


# ---- the dispatch mode ---------------------------------------------------------------------
def _to_device(value) -> torch.device | None:
    if value is None:
        return None
    d = torch.device(value) if not isinstance(value, torch.device) else value
    return d


def _same_device_error(op: str) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
        f"(emulated CUDA, in {op})"
    )


_INDEX_OPS = {"aten::index.Tensor", "aten::index_put_", "aten::_index_put_impl_", "aten::index_put",
              "aten::_unsafe_index.Tensor", "aten::_unsafe_index_put"}


class _DispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        if name in _SPECIAL:
            return _SPECIAL[name](func, args, kwargs)

        target = _to_device(kwargs.get("device")) if "device" in kwargs else None
        flat, spec = pytree.tree_flatten((args, kwargs))
        on_device = target is not None and target.type == "cuda"
        if not on_device and (target is None):
            on_device = any(isinstance(a, DeviceTensor) for a in flat)
        if not on_device:
            # Plain CPU work, or an explicit device="cpu" (e.g. zeros_like(x, device="cpu")).
            if any(isinstance(a, DeviceTensor) for a in flat):
                flat = [a.elem if isinstance(a, DeviceTensor) else a for a in flat]
                args, kwargs = pytree.tree_unflatten(flat, spec)
            return func(*args, **kwargs)

        # The op runs "on the device": check devices, apply the sync rules, run on the CPU.
        for a in flat:
            if type(a) is torch.Tensor and a.dim() > 0:
                if name in _INDEX_OPS and a.dtype in (torch.long, torch.int, torch.bool, torch.uint8):
                    # CUDA copies CPU index tensors to the device itself, with a blocking copy.
                    record(H2D, name, "a CPU index tensor is copied to the device", a, blocking=True,
                           pinned=False)
                    continue
                raise _same_device_error(name)
        reason = rules.sync_reason(name, args, kwargs)
        if reason is not None:
            record(SYNC, name, reason, *[a for a in flat if isinstance(a, DeviceTensor)])
        collectors = active_collectors()
        if collectors and is_launch(func):
            for c in list(collectors):
                c.add_launch(name)

        wrappers = {}
        unwrapped = []
        for a in flat:
            if isinstance(a, DeviceTensor):
                wrappers[id(a.elem)] = a
                unwrapped.append(a.elem)
            elif isinstance(a, torch.device) and a.type == "cuda":
                unwrapped.append(_CPU)
            else:
                unwrapped.append(a)
        args, kwargs = pytree.tree_unflatten(unwrapped, spec)
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        gap = CPU_KERNEL_GAPS.get(name)
        out = gap(func, args, kwargs) if gap is not None else func(*args, **kwargs)
        # In-place and out= ops return their input: hand back the same wrapper object.
        return pytree.tree_map(lambda o: _rewrap(o, wrappers, name), out)


def _rewrap(o, wrappers: dict, op: str):
    if type(o) is not torch.Tensor:
        return o
    w = wrappers.get(id(o))
    if w is None:
        return DeviceTensor(o)
    if w.shape != o.shape or w.stride() != o.stride():
        # A wrapper's sizes are fixed when it is made; ops that change them in place
        # (resize_, t_, unsqueeze_, ...) cannot be mirrored on the same object.
        raise NotImplementedError(f"{op} changes a tensor's shape in place; syncfree.emulate_cuda() cannot emulate it")
    return w


def _to_copy(func, args, kwargs):
    (src,) = args
    target = _to_device(kwargs.get("device"))
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


_SPECIAL = {
    "aten::_to_copy": _to_copy,
    "aten::copy_": _copy_,
    "aten::is_pinned": _is_pinned,
    "aten::_pin_memory": _pin_memory,
}


# ---- the context ---------------------------------------------------------------------------
# Emulation is per thread: each thread that enters emulate_cuda() gets its own dispatch modes (they
# are thread-local in PyTorch) and is_emulating() answers per thread. What has to be process-wide
# (the fake device guard, torch.cuda's stand-ins, the parameter-swap flag) is installed by the first
# thread in and restored by the last one out; the stand-ins answer as the real torch.cuda in threads
# that are not emulating.
_local = threading.local()
_shared_lock = threading.Lock()
_shared: dict = {"threads": 0}


def is_emulating() -> bool:
    """True inside ``emulate_cuda()`` on this thread."""
    return getattr(_local, "depth", 0) > 0


def real_cuda_available() -> bool:
    """True when a real CUDA device is usable: ``torch.cuda.is_available()`` says yes inside ``emulate_cuda()``."""
    return not is_emulating() and torch.cuda.is_available()


def _per_thread(standin, real):
    def answer(*args, **kwargs):
        return standin(*args, **kwargs) if is_emulating() else real(*args, **kwargs)
    answer.__name__ = getattr(real, "__name__", "standin")
    return answer


def _install() -> None:
    guard = FakeCudaGuard()
    guard.install()
    real = {name: getattr(torch.cuda, name) for name in CUDA_STANDINS}
    for name, standin in CUDA_STANDINS.items():
        setattr(torch.cuda, name, _per_thread(standin, real[name]))
    # model.to("cpu") must swap each emulated parameter for a plain one in place (as model.to("cuda")
    # did the other way), or the module would keep wrappers whose data is on the host.
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    _shared.update(guard=guard, real=real, swap=swap)


def _restore() -> None:
    torch.__future__.set_swap_module_params_on_conversion(_shared.pop("swap"))
    for name, fn in _shared.pop("real").items():
        setattr(torch.cuda, name, fn)
    _shared.pop("guard").restore()


@contextlib.contextmanager
def emulate_cuda():
    """Run code that uses ``"cuda"`` on the CPU while recording what a real CUDA device would do.

    Results are bit-identical to a plain CPU run. Use ``syncfree.audit()`` inside
    it to collect the events. Raises ``EmulationUnavailable`` when the shim it needs
    cannot be built, and refuses to run where a real CUDA device is available.

    Inside, ``torch.cuda`` answers as one available device of compute capability 9.0:
    ``is_available()``, ``device_count()``, ``current_device()``, ``get_device_name()``,
    ``get_device_capability()``, ``get_device_properties()`` (name, major, minor,
    total_memory, multi_processor_count) and ``is_bf16_supported()``; ``synchronize()``
    is recorded as a sync. ``is_initialized()`` stays False (torch's own helpers would
    call into a CUDA runtime this machine lacks), and streams, events, memory
    statistics and random-number state are not emulated. Everything is restored on exit.
    (To ask whether a *real* GPU is there from code that may run inside, use
    ``real_cuda_available()``.)

    Emulation belongs to the thread that enters it: several threads may emulate at once, each
    auditing only its own work, and threads that do not enter see the real ``torch.cuda``.
    """
    depth = getattr(_local, "depth", 0)
    if depth:  # re-entrant: the outer context already set everything up
        _local.depth = depth + 1
        try:
            yield
        finally:
            _local.depth = depth
        return
    if torch.cuda.is_available():  # (this thread is not emulating: the real answer)
        raise RuntimeError(
            "syncfree.emulate_cuda() is for machines without a CUDA device; this one has one. "
            "Use syncfree.audit() directly: it reads syncs and copies from the real device."
        )
    from .api_mode import ApiMode

    with _shared_lock:
        if _shared["threads"] == 0:
            _install()
        _shared["threads"] += 1
    _local.depth = 1
    try:
        with ApiMode(), _DispatchMode():
            yield
    finally:
        _local.depth = 0
        with _shared_lock:
            _shared["threads"] -= 1
            if _shared["threads"] == 0:
                _restore()
