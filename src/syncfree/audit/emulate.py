"""An emulated CUDA device for CPU-only machines: runs on the CPU, records what CUDA would do.

Inside ``with emulate_cuda():`` (where ``torch.cuda`` answers as one sm_90 device, see
``cuda_standins.py``) a tensor put on ``"cuda"`` becomes a
``DeviceTensor``: a wrapper that reports ``device='cuda:0'`` and holds an
ordinary CPU tensor. Every aten op is seen by a ``TorchDispatchMode``, which
runs it on the held CPU tensors (so the numbers are bit for bit those of a
plain CPU run) and, when the op touches device data, applies the rule table
(``rules.py``) and records syncs and host/device copies with the source line
that caused them.

Five things make this work on a CPU-only PyTorch build (and on a CUDA build without a GPU):

* ``torch.cuda._lazy_init`` is what C++ calls before a factory such as
  ``torch.arange(n, device="cuda")`` reaches the dispatcher; we replace it with
  a no-op while emulating, so the call reaches our dispatch mode instead of
  failing with "Torch not compiled with CUDA enabled".
* Python bindings such as ``x[i]`` open a device guard for the tensor's device;
  ``guard_shim`` installs c10's header-only fake guard for CUDA.
* The autograd engine asks ATen's CUDA hooks whether CUDA is there and which devices hold a
  context before it runs a backward; the same shim answers them for the emulated device, and
  backward runs on the calling thread (so this thread's audits and modes see it).
* ``torch.tensor``/``as_tensor``/``new_tensor`` skip the Python dispatch layer,
  and ``F.scaled_dot_product_attention`` picks a kernel by device type before
  it reaches aten; a ``TorchFunctionMode`` handles those (``api_mode.py``).
* ``DeviceTensor`` implements the flatten protocol, so ``model.to("cuda")``
  swaps parameters in place and tied weights stay tied.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
import traceback
import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import rules
from .api_mode import ApiMode, hook_engine_start, unhook_engine_start
from .cpu_kernel_gaps import CPU_KERNEL_GAPS
from .cuda_standins import CUDA_STANDINS
from .device_tensor import DeviceTensor, current_api, record
from .emulated_copies import COPY_HANDLERS as _SPECIAL
from .emulated_copies import device_of, is_pinned
from .events import H2D, SYNC, active_collectors
from .guard_shim import FakeCudaGuard
from .launches import is_launch

__all__ = ["DeviceTensor", "emulate_cuda", "is_emulating", "is_pinned", "real_cuda_available", "record",
           "current_api"]

_CPU = torch.device("cpu")


# ---- the dispatch mode ---------------------------------------------------------------------

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

        target = device_of(kwargs.get("device")) if "device" in kwargs else None
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


def _remembering_setattr(setattr_):
    """``Module.__setattr__`` that notes where an emulating thread leaves an emulated tensor in a module's
    plain attributes (stock caches e.g. ``rope_deltas`` there): ``model.to()`` does not move those, and the
    emulated device ends with the context, so the context's exit brings them back to the host."""
    def remembering(module, name, value):
        setattr_(module, name, value)
        if isinstance(value, DeviceTensor) and is_emulating():
            _local.left.append((weakref.ref(module), name))
    return remembering


def _bring_back_left_tensors() -> None:
    for ref, name in _local.left:
        module = ref()
        value = module.__dict__.get(name) if module is not None else None
        if isinstance(value, DeviceTensor):
            module.__dict__[name] = value.elem  # its data, on the host
    _local.left = []


def _apply_freeing_a_failed_forward(apply):
    """``Module._apply`` for emulating threads that survives ``finally: model.to("cpu")`` after a forward that
    raised with grad enabled. The exception in flight holds the forward's frames, their locals hold its
    autograd graph and the graph holds the parameters, so ``swap_tensors`` refuses to swap them ("Couldn't
    swap") and that error would bury the user's. Here the frames' locals of the exceptions being handled are
    cleared (the exceptions and their tracebacks stay; a debugger sees no locals in them) and the move is
    made again."""
    def apply_(module, *args, **kwargs):
        try:
            return apply(module, *args, **kwargs)
        except RuntimeError as err:
            if not is_emulating() or "Couldn't swap" not in str(err):
                raise
            handled = err.__context__
            if handled is None:
                raise
            while handled is not None:
                if handled.__traceback__ is not None:
                    traceback.clear_frames(handled.__traceback__)
                handled = handled.__context__
            return apply(module, *args, **kwargs)
    return apply_


def _emulating_loop(loop, *args, **kwargs):
    with emulate_cuda():
        return loop(*args, **kwargs)


def _install() -> None:
    optimizer_module = importlib.import_module("torch.optim.optimizer")  # (torch.optim hides the name)
    guard = FakeCudaGuard()
    guard.install()
    real = {name: getattr(torch.cuda, name) for name in CUDA_STANDINS}
    for name, standin in CUDA_STANDINS.items():
        setattr(torch.cuda, name, _per_thread(standin, real[name]))
    # model.to("cpu") must swap each emulated parameter for a plain one in place (as model.to("cuda")
    # did the other way), or the module would keep wrappers whose data is on the host. Only in emulating
    # threads: Module._apply asks torch.__future__ at call time, so the answer can be per thread.
    swap = torch.__future__.get_swap_module_params_on_conversion
    torch.__future__.get_swap_module_params_on_conversion = _per_thread(lambda: True, swap)
    # A DataLoader's pin-memory thread pins what its emulating thread asked for: it emulates too (a
    # DataLoader pins only where CUDA is available, so no other thread of this machine starts one).
    pin_module = importlib.import_module("torch.utils.data._utils.pin_memory")
    pin_loop = pin_module._pin_memory_loop
    pin_module._pin_memory_loop = functools.wraps(pin_loop)(functools.partial(_emulating_loop, pin_loop))
    # Each autograd node keeps the forward stack that made it, so a backward op can be attributed to
    # its forward line (phases.py). Without the NaN checks: those read every gradient on the host.
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    torch.autograd.set_detect_anomaly(True, check_nan=False)
    # Optimizers pick their default implementation (foreach on CUDA) only for plain tensor types: let
    # the emulated device's tensors count as one, so optimizer.step() takes the path it takes on CUDA.
    optimizer_module._foreach_supported_types.append(DeviceTensor)
    module_methods = (torch.nn.Module.__setattr__, torch.nn.Module._apply)
    torch.nn.Module.__setattr__ = _remembering_setattr(module_methods[0])
    torch.nn.Module._apply = _apply_freeing_a_failed_forward(module_methods[1])
    hook_engine_start()
    _shared.update(guard=guard, real=real, swap=swap, anomaly=anomaly, optimizer_module=optimizer_module,
                   pin=(pin_module, pin_loop), module_methods=module_methods)


def _restore() -> None:
    torch.nn.Module.__setattr__, torch.nn.Module._apply = _shared.pop("module_methods")
    unhook_engine_start()
    _shared.pop("optimizer_module")._foreach_supported_types.remove(DeviceTensor)
    enabled, check_nan = _shared.pop("anomaly")
    torch.autograd.set_detect_anomaly(enabled, check_nan=check_nan)
    torch.__future__.get_swap_module_params_on_conversion = _shared.pop("swap")
    pin_module, pin_loop = _shared.pop("pin")
    pin_module._pin_memory_loop = pin_loop
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

    Training works too: ``backward()``, ``torch.autograd.grad``, gradient checkpointing and
    optimizers run, bit-identical to the CPU. Backward runs on the calling thread (autograd's
    device threads are switched off inside), anomaly mode is on without its NaN checks (it keeps
    each autograd node's forward stack, so backward events name the forward line that made them),
    and optimizers choose their default implementation as they would for CUDA tensors.
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
    with _shared_lock:
        if _shared["threads"] == 0:
            _install()
        _shared["threads"] += 1
    _local.depth = 1
    _local.left = []
    try:
        # Backward runs on this thread: the engine would hand device work to a thread of its own,
        # which neither sees this thread's audits nor needs to (the ops and results are the same).
        with ApiMode(), _DispatchMode(), torch.autograd.set_multithreading_enabled(False):
            yield
    finally:
        _local.depth = 0
        _bring_back_left_tensors()
        with _shared_lock:
            _shared["threads"] -= 1
            if _shared["threads"] == 0:
                _restore()
