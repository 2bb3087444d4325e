"""The Python-level half of the emulated device.

A ``TorchFunctionMode`` that (1) remembers which Python API is running, so each
event can name it (``Tensor.__getitem__`` rather than only ``aten::nonzero``),
and (2) handles the few calls that never reach the aten dispatcher the way the
emulator needs: ``torch.tensor``/``as_tensor``/``Tensor.new_tensor`` and
``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode, resolve_name

from . import rules
from .device_tensor import DeviceTensor, api_stack, record
from .events import H2D, SYNC, active_collectors

__all__ = ["ApiMode", "hook_engine_start", "unhook_engine_start"]

_CPU = torch.device("cpu")

_names: dict = {}


def api_name(func) -> str:
    name = _names.get(func)
    if name is None:
        try:
            name = resolve_name(func) or getattr(func, "__qualname__", repr(func))
        except Exception:  # some builtins cannot be resolved; a name is only a label
            name = getattr(func, "__qualname__", repr(func))
        name = name.replace("torch.Tensor.", "Tensor.").replace("torch.nn.functional.", "F.")
        _names[func] = name
    return name


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _read_device_elements(data, api: str):
    """Replace device tensors nested in lists/tuples by CPU copies, recording one read each."""
    if isinstance(data, DeviceTensor):
        record(SYNC, api, rules.PYTHON_SYNC_RULES["torch.tensor"], data, api=api)
        return data.elem
    if isinstance(data, (list, tuple)):
        return type(data)(_read_device_elements(d, api) for d in data)
    return data


def _new_tensor(func, args, kwargs, api: str):
    if func is torch.Tensor.new_tensor:
        owner, data, rest = args[0], args[1], args[2:]
        device = kwargs.pop("device", owner.device)
        kwargs.setdefault("dtype", owner.dtype)
        build = torch.tensor
    else:
        data, rest = args[0], args[1:]
        device = kwargs.pop("device", None)
        build = func
    if isinstance(data, torch.Tensor):
        # From a tensor: a device-aware conversion, which the dispatch mode records.
        out = data if build is torch.as_tensor else data.detach().clone()
        return out.to(device=device if device is not None else data.device, dtype=kwargs.get("dtype"))
    host_data = _read_device_elements(data, api)
    out = build(host_data, *rest, device=_CPU, **kwargs)
    if _is_cuda(device):
        # The list is turned into a tensor on the host, then copied with a blocking copy
        # (CUDA skips the copy of an empty tensor).
        if out.numel():
                record(H2D, api, "torch.tensor(data, device='cuda') copies host data to the device", out,
                   blocking=True, pinned=False, api=api)
        return DeviceTensor(out)
    return out


class _EmulatedKernel(torch.autograd.Function):
    """Runs a function on the held CPU tensors; its backward runs the same function's CPU graph.

    The backward computes the function again on the saved inputs (CPU kernels are deterministic,
    so the values are the forward's) and asks that graph for the gradients: both passes run exactly
    the kernels a plain CPU run would. Only the inputs are saved, through ``save_for_backward``, so
    saved-tensor hooks (gradient checkpointing) see what they would see for a fused kernel.
    """

    @staticmethod
    def forward(ctx, fn, spec, *flat):
        plain = [a.elem if isinstance(a, DeviceTensor) else a for a in flat]
        args, kwargs = pytree.tree_unflatten(plain, spec)
        tensors = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        ctx.fn, ctx.spec, ctx.flat, ctx.tensors = fn, spec, [None if i in tensors else a for i, a in enumerate(flat)], \
            tensors
        ctx.wants = [isinstance(a, torch.Tensor) and a.requires_grad for a in flat]
        ctx.save_for_backward(*[flat[i] for i in tensors])
        return DeviceTensor(fn(*args, **kwargs))

    @staticmethod
    def backward(ctx, grad):
        for collector in list(active_collectors()):  # one fused attention backward kernel on CUDA
            collector.add_launch("aten::scaled_dot_product_attention_backward")
        flat = list(ctx.flat)
        for i, t in zip(ctx.tensors, ctx.saved_tensors):
            t = t.elem if isinstance(t, DeviceTensor) else t
            flat[i] = t.detach().requires_grad_() if ctx.wants[i] else t
        args, kwargs = pytree.tree_unflatten(flat, ctx.spec)
        inputs = [flat[i] for i, w in enumerate(ctx.wants) if w]
        with torch.enable_grad():
            out = ctx.fn(*args, **kwargs)
        plain_grad = grad.elem if isinstance(grad, DeviceTensor) else grad
        grads = iter(torch.autograd.grad(out, inputs, plain_grad, allow_unused=True) if inputs else ())
        result = [None, None]  # fn, spec
        for w in ctx.wants:
            g = next(grads) if w else None
            result.append(DeviceTensor(g) if g is not None else None)
        return tuple(result)


def _sdpa(func, args, kwargs):
    # On a CPU build, SDPA with a "cuda" query picks its kernel by device type before it
    # reaches aten. Run it on the CPU tensors so the numbers match a plain CPU run.
    flat, spec = pytree.tree_flatten((args, kwargs))
    for a in flat:
        if type(a) is torch.Tensor and a.dim() > 0:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                "cpu! (emulated CUDA, in F.scaled_dot_product_attention)"
            )
    for collector in list(active_collectors()):  # one fused attention kernel on CUDA
        collector.add_launch("aten::scaled_dot_product_attention")
    return _EmulatedKernel.apply(func, spec, *flat)


_NEW_TENSOR = {torch.tensor, torch.as_tensor, torch.Tensor.new_tensor}
_ITEM_ACCESS = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}


def index_parts(index) -> tuple:
    """The separate indices in ``x[index]``, as PyTorch reads them.

    Like old NumPy, PyTorch still reads a short list that holds tensors, sequences, slices, None
    or Ellipsis as a tuple of indices (deprecated, with a warning), and any other list as one index.
    """
    if isinstance(index, tuple):
        return index
    if isinstance(index, list) and len(index) < 32 and any(
            isinstance(p, (torch.Tensor, list, tuple, slice)) or p is None or p is Ellipsis for p in index):
        return tuple(index)
    return (index,)


def _plain_list(x) -> bool:
    return isinstance(x, list) and all(_plain_list(v) if isinstance(v, list) else isinstance(v, (int, bool))
                                       for v in x)


def _host_list_indices(args: tuple) -> tuple:
    # x[[0, 2]] on CUDA builds the index on the host and copies it over; PyTorch makes it below the
    # dispatcher, where the emulated device cannot allocate. Handing the index kernel a host tensor
    # instead takes the same route (the dispatch mode records the copy) with the same result.
    parts = index_parts(args[1])
    if not any(_plain_list(p) for p in parts):
        return args
    parts = tuple(torch.tensor(p, device=_CPU) if _plain_list(p) else p for p in parts)
    return (args[0], parts if len(parts) > 1 or isinstance(args[1], tuple) else parts[0], *args[2:])


_STARTS_BACKWARD = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}
_local = threading.local()


def _engine_with_mode(real):
    def run(*args, **kwargs):
        mode = getattr(_local, "pending", None)
        if mode is None:
            return real(*args, **kwargs)
        _local.pending = None
        with mode:  # (the engine entry point checks no torch function: nothing recurses)
            return real(*args, **kwargs)
    run.syncfree_real = real
    return run


def hook_engine_start() -> None:
    """While emulating: the autograd engine starts with the ApiMode of the thread that called it."""
    real = getattr(torch.autograd, "_engine_run_backward", None)
    if real is not None and not hasattr(real, "syncfree_real"):
        torch.autograd._engine_run_backward = _engine_with_mode(real)


def unhook_engine_start() -> None:
    hooked = getattr(torch.autograd, "_engine_run_backward", None)
    if hooked is not None and hasattr(hooked, "syncfree_real"):
        torch.autograd._engine_run_backward = hooked.syncfree_real


class ApiMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        stack = api_stack()
        name = api_name(func)
        stack.append(name)
        try:
            if func in _NEW_TENSOR:
                return _new_tensor(func, args, kwargs, name)
            if func in _ITEM_ACCESS and len(args) > 1 and isinstance(args[0], DeviceTensor):
                args = _host_list_indices(args)
            if func is F.scaled_dot_product_attention and any(
                isinstance(a, DeviceTensor) for a in pytree.tree_leaves((args, kwargs))
            ):
                return _sdpa(func, args, kwargs)
            if func in _STARTS_BACKWARD:
                # The autograd engine runs the backward (and checkpointing's recompute, which needs
                # this mode's SDPA) with the modes active when it starts, and a mode is off the stack
                # while its own handler runs: the engine hook below puts this one back for that start.
                _local.pending = self
                try:
                    return func(*args, **kwargs)
                finally:
                    _local.pending = None
            return func(*args, **kwargs)
        finally:
            stack.pop()
