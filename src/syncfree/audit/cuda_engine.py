"""The real-CUDA engine: the same events as the emulator, read from a real device.

* Syncs come from ``torch.cuda.set_sync_debug_mode("warn")``: CUDA's own hook
  warns at each synchronizing call, and we take the Python stack at that moment.
  That hook sits in stream synchronizes and blocking copies only, so a device-wide
  ``torch.cuda.synchronize()`` would pass unseen: it is wrapped for the audit.
* Copies come from the Python calls that make them (``.to``, ``.cuda``, ``.cpu``,
  ``copy_``, ``torch.tensor(..., device=...)``), with their direction, size,
  pinning and blocking; the profiler's memcpy activities are counted beside them
  (``Report.device_memcpy``) so the two can be checked against each other.

A blocking copy also trips the sync warning (CUDA waits inside the copy); it is
reported once, as a copy, the way the emulator reports it.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from .api_mode import api_name, index_parts
from .events import D2H, H2D, SYNC, Event
from .phases import locate
from .rules import PYTHON_SYNC_RULES

__all__ = ["CudaEngine", "CudaUnavailable"]

_SYNC_WARNING = "synchronizing CUDA operation"


class CudaUnavailable(RuntimeError):
    """The real-CUDA engine was asked for on a machine without a usable CUDA device."""


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _holds_device_tensor(data) -> bool:
    if isinstance(data, torch.Tensor):
        return data.is_cuda
    if isinstance(data, (list, tuple)):
        return any(_holds_device_tensor(d) for d in data)
    return False


def _copy_kind(func, args, kwargs):
    """(direction, source tensor, non_blocking) when this call copies between host and device."""
    if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu) and args:
        src = args[0]
        if func is torch.Tensor.cuda:
            device, non_blocking = "cuda", kwargs.get("non_blocking", False)
        elif func is torch.Tensor.cpu:
            device, non_blocking = "cpu", False
        else:
            device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
        if device is None or torch.device(device).type == src.device.type:
            return None
        return (H2D if _is_cuda(device) else D2H), src, bool(non_blocking)
    if func is torch.Tensor.copy_ and len(args) >= 2:
        dst, src = args[0], args[1]
        if dst.is_cuda != src.is_cuda:
            nb = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
            return (H2D if dst.is_cuda else D2H), src, nb
    if func in (torch.tensor, torch.as_tensor) and _is_cuda(kwargs.get("device")):
        if not _holds_device_tensor(args[0] if args else None):
            return H2D, None, False
    return None


_INDEX_DTYPES = (torch.long, torch.int, torch.bool, torch.uint8)
_INDEXING = {torch.Tensor.__getitem__: 1, torch.Tensor.__setitem__: 1, torch.Tensor.index_put_: 1,
             torch.Tensor.index_put: 1, torch.index_put: 1, torch.index_put_: 1}


def cpu_indices(index) -> list:
    """The parts of an index that CUDA copies to the device first: host index tensors and sequences.

    0-dim host tensors act as plain integers (no copy); slices, ints, None and Ellipsis need none.
    Mirrors the emulator, which sees these as CPU tensors reaching the device's index kernels.
    """
    out = []
    for part in index_parts(index):
        if isinstance(part, torch.Tensor):
            if not part.is_cuda and part.dim() > 0 and part.dtype in _INDEX_DTYPES:
                out.append(part)
        elif isinstance(part, list):
            out.append(part)
    return out


def _index_copies(func, args, kwargs) -> list:
    """Host indices that an indexing call on a device tensor copies to the device (blocking)."""
    position = _INDEXING.get(func)
    if position is None or len(args) <= position or not getattr(args[0], "is_cuda", False):
        return []
    return cpu_indices(args[position])


def _index_event(index, api: str | None) -> Event:
    nbytes = index.numel() * index.element_size() if isinstance(index, torch.Tensor) else 8 * len(index)
    shape = tuple(index.shape) if isinstance(index, torch.Tensor) else (len(index),)
    phase, stack = locate()
    return Event(kind=H2D, op="index", api=api, reason="a CPU index tensor is copied to the device",
                 shapes=(shape,), nbytes=nbytes, blocking=True, pinned=False, waits=False, engine="cuda",
                 stack=stack, phase=phase)


class _CallTracker(TorchFunctionMode):
    """Remembers the running Python API, and records the copies it makes."""

    def __init__(self, engine: "CudaEngine") -> None:
        super().__init__()
        self.engine = engine
        self.api: str | None = None
        self.in_copy = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        outer = (self.api, self.in_copy)
        name = self.api = api_name(func)
        copy = _copy_kind(func, args, kwargs)
        indices = _index_copies(func, args, kwargs)
        # The stream sync inside a blocking copy is the copy's, reported with it (as the emulator does).
        self.in_copy = copy is not None or bool(indices)
        try:
            out = func(*args, **kwargs)
        finally:
            self.api, self.in_copy = outer
        for index in indices:
            self.engine.add(_index_event(index, name))
        if copy is not None:
            direction, src, non_blocking = copy
            data = out if isinstance(out, torch.Tensor) else src
            host = src if direction == H2D else (args[0] if func is torch.Tensor.copy_ else out)
            pinned = bool(host is not None and host.is_pinned())
            blocking = not (non_blocking and pinned)
            phase, stack = locate()
            self.engine.add(Event(
                kind=direction, op=getattr(func, "__name__", "copy"), api=name,
                reason="a host-to-device copy" if direction == H2D else "a device-to-host copy",
                shapes=(tuple(data.shape),) if isinstance(data, torch.Tensor) else (),
                nbytes=data.numel() * data.element_size() if isinstance(data, torch.Tensor) else 0,
                blocking=blocking, pinned=pinned, waits=blocking and direction == D2H,
                engine="cuda", stack=stack, phase=phase,
            ))
        return out


class _HostWaits:
    """Turns CUDA's sync warnings, and Python calls of ``torch.cuda.synchronize``, into sync events.

    Installed for one audit; needs no device itself (``torch.cuda.synchronize`` is only wrapped),
    so its logic is tested on the CPU.
    """

    def __init__(self, add, tracker: _CallTracker) -> None:
        self._add, self._tracker = add, tracker

    def _sync_event(self, reason: str, api: str | None) -> None:
        phase, stack = locate()
        self._add(Event(kind=SYNC, op="cuda sync", api=api, reason=reason, engine="cuda", stack=stack, phase=phase))

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if _SYNC_WARNING not in str(message):
            return self._previous_show(message, category, filename, lineno, file, line)
        if self._tracker.in_copy:
            return None  # the copy itself is recorded, with whether it blocked
        self._sync_event(str(message).split("\n")[0], self._tracker.api)
        return None

    def _synchronize(self, device=None) -> None:
        self._real_synchronize(device)
        self._sync_event(PYTHON_SYNC_RULES["torch.cuda.synchronize"], "torch.cuda.synchronize")

    def install(self) -> None:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("always", message=f".*{_SYNC_WARNING}.*")
        self._previous_show = warnings.showwarning
        warnings.showwarning = self._on_warning
        self._real_synchronize = torch.cuda.synchronize
        torch.cuda.synchronize = self._synchronize

    def uninstall(self) -> None:
        torch.cuda.synchronize = self._real_synchronize
        warnings.showwarning = self._previous_show
        self._warnings.__exit__(None, None, None)


class CudaEngine:
    """Collects syncs and copies on a real CUDA device into ``report`` between ``start`` and ``stop``."""

    def __init__(self, report) -> None:
        from .emulate import is_emulating

        if is_emulating():  # torch.cuda.is_available() answers True in there, for the emulated device
            raise CudaUnavailable(
                "the real-CUDA audit engine cannot run inside syncfree.emulate_cuda(): tensors on 'cuda' are "
                "emulated there. Use syncfree.audit() or audit(engine='emulated') inside it."
            )
        if not torch.cuda.is_available():
            raise CudaUnavailable(
                "the real-CUDA audit engine needs a CUDA device, and this machine has none. On a CPU-only "
                "machine run the code inside `with syncfree.emulate_cuda():` (tensors on 'cuda' then run on "
                "the CPU while every sync and copy a GPU would make is recorded)."
            )
        self.report = report
        self._tracker = _CallTracker(self)
        self._waits = _HostWaits(self.add, self._tracker)

    def add(self, event: Event) -> None:
        self.report.add(event)

    def start(self) -> None:
        torch.cuda.synchronize()  # work queued before the audit is not the audited code's to wait for
        self._waits.install()
        self._profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        )
        self._profiler.__enter__()
        self._tracker.__enter__()
        self._previous_mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        torch.cuda.set_sync_debug_mode(self._previous_mode)
        self._tracker.__exit__(None, None, None)
        self._waits.uninstall()
        torch.cuda.synchronize()
        self._profiler.__exit__(None, None, None)
        self.report.device_memcpy = count_memcpy(self._profiler.events())


def count_memcpy(events) -> dict[str, int]:
    """Counts of the profiler's memcpy activities and stream syncs, by name."""
    counts: Counter[str] = Counter()
    for e in events:
        name = getattr(e, "name", "")
        if name.startswith("Memcpy") or name in ("cudaStreamSynchronize", "cudaDeviceSynchronize"):
            counts[name] += 1
    return dict(counts)
