"""A stock per-item loop as one opaque operator whose backward recomputes it, for forwards that ``torch.compile``
traces with dynamic shapes.

Stock code that loops in Python over the items of a batch (a ``tolist()`` of a grid, a ``split`` by per-item
lengths) is unrolled by Dynamo: one graph per number and size of items, so a stream of layouts recompiles until
Dynamo's limit. ``recomputed_op`` wraps such a stock function in a custom operator that takes the per-item sizes as
a host (CPU) tensor or ints: reading them waits for no device, Dynamo sees only the operator's fake output, and the
graph holds one call whatever the items. Inside, the very calls the eager path makes, in the same order: the outputs
are the eager ones bit for bit.

Its backward is an operator too (``<name>_backward``): it runs the stock function again under autograd and takes its
gradients, so the gradients are the eager path's (at the cost of one more forward of the loop, as activation
checkpointing costs). Stock's function is traced by neither.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Sequence

import torch

__all__ = ["recomputed_op", "autograd_inside", "laid_out_like", "class_path", "stock_class"]


def class_path(cls: type) -> str:
    """``cls`` named as ``module:Class``: an operator's schema takes no class, so a stock class whose method the
    operator calls travels by name (``stock_class`` finds it again)."""
    return f"{cls.__module__}:{cls.__qualname__}"


def stock_class(path: str) -> type:
    """The class ``class_path`` named."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def laid_out_like(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``grad`` laid out as ``like`` (what the operator's fake gives, ``empty_like``): a traced backward views the
    gradient as the graph planned (a transposed input's gradient, for one); a view (of the incoming gradient, say) is
    copied too, as an operator's output may alias none of its inputs."""
    if grad.stride() == like.stride() and grad._base is None:
        return grad
    return torch.empty_like(like).copy_(grad)


def autograd_inside():
    """Autograd back on inside an operator's body (the dispatcher runs a custom operator with its autograd keys
    excluded): the backward differentiates the per-item calls it runs again. The thread's other exclusions stay."""
    keys = torch._C._dispatch_tls_local_exclude_set()
    for name in ("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor", "AutogradCPU", "AutogradCUDA",
                 "ADInplaceOrView"):
        key = getattr(torch._C.DispatchKey, name, None)
        if key is not None and keys.has(key):
            keys = keys.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), keys)


def _prototype(function: Callable, parameters: list[inspect.Parameter], returns) -> Callable:
    """``function`` under the signature the operator's schema is inferred from (types resolved: the modules that
    define stock functions postpone their annotations)."""
    function.__signature__ = inspect.Signature(parameters, return_annotation=returns)
    return function


def recomputed_op(name: str, stock: Callable[..., torch.Tensor], output: Callable[..., torch.Tensor],
                  differentiable: int = 1, sized_by: Sequence[str] = ()):
    """``stock`` as the custom operator ``name``, with a backward that recomputes it; returns the operator.

    ``stock``: the stock function (annotated: its annotations make the schema); its first ``differentiable``
    parameters are the tensors the gradient flows to (``None`` allowed where annotated optional: a bias; a list of
    tensors where annotated ``list[torch.Tensor]``: a module's parameters, each its own gradient), the rest what
    stock loops over (host tensors, ints). ``sized_by``: names of tensors the operator takes after ``stock``'s
    parameters only for ``output``'s sake (a size Dynamo keeps dynamic, which the host values cannot give it);
    ``stock`` never sees them and the backward does not keep them. ``output``: of the operator's arguments, an empty
    tensor of the output's size and dtype (the fake Dynamo traces with).
    """
    hints = typing.get_type_hints(stock)
    own = [p.replace(annotation=hints[p.name]) for p in inspect.signature(stock).parameters.values()]
    sizers = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor) for n in sized_by]
    count = len(own)

    def forward(*args):
        with torch.no_grad():
            return stock(*args[:count])

    op = torch.library.custom_op(name, _prototype(forward, own + sizers, torch.Tensor), mutates_args=())
    op.register_fake(output)

    def recompute(grad, *args):
        inputs = args[:differentiable]
        with autograd_inside(), torch.enable_grad():
            leaves = [_each(t, lambda x: x.detach().requires_grad_(True)) for t in inputs]
            out = stock(*leaves, *args[differentiable:])
            grads = iter(torch.autograd.grad(out, [t for t in _flat(leaves) if t is not None], grad))
            return [_absent(inputs) if t is None else laid_out_like(next(grads), t) for t in _flat(inputs)]

    grad_param = inspect.Parameter("grad", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)
    backward_op = torch.library.custom_op(f"{name}_backward",
                                          _prototype(recompute, [grad_param, *own], list[torch.Tensor]),
                                          mutates_args=())

    @backward_op.register_fake
    def _(grad, *args):
        inputs = args[:differentiable]
        return [_absent(inputs) if t is None else torch.empty_like(t) for t in _flat(inputs)]

    def setup_context(ctx, inputs, output):
        kept = inputs[:count]
        # tensors saved as autograd saves them (a list's one by one), absent ones as None; the rest kept as it is
        ctx.save_for_backward(*_flat(a for a in kept if _is_tensors(a)))
        ctx.kinds = tuple(_Saved(len(a) if isinstance(a, list) else None) if _is_tensors(a) else a for a in kept)

    def backward(ctx, grad):
        saved = iter(ctx.saved_tensors)
        args = [kind.take(saved) if isinstance(kind, _Saved) else kind for kind in ctx.kinds]
        grads = iter(backward_op(grad, *args))
        found = []
        for t in args[:differentiable]:
            if isinstance(t, list):  # (a list's gradients as a list)
                found.append([next(grads) for _ in t])
            else:  # (None for an absent input: its stand-in gradient dropped)
                g = next(grads)
                found.append(None if t is None else g)
        return (*found, *[None] * (count - differentiable + len(sizers)))

    op.register_autograd(backward, setup_context=setup_context)
    return op


def _absent(inputs) -> torch.Tensor:
    # The gradient of an absent optional input (no bias): a list of tensors holds no None, so an empty one stands in;
    # the autograd formula gives None for it.
    return next(t for t in _flat(inputs) if t is not None).new_empty((0,))


def _flat(items) -> list:
    """``items`` with each list of tensors (a module's parameters) spread out in its place."""
    return [t for item in items for t in (item if isinstance(item, list) else (item,))]


def _is_tensors(item) -> bool:
    """A tensor argument: a tensor, an absent one (None), a list of tensors."""
    if isinstance(item, list):
        return all(isinstance(t, torch.Tensor) for t in item)
    return item is None or isinstance(item, torch.Tensor)


def _each(item, fn):
    """``fn`` of a tensor, of each tensor of a list of tensors; None kept."""
    if isinstance(item, list):
        return [fn(t) for t in item]
    return None if item is None else fn(item)


class _Saved:
    """What the autograd context keeps of a tensor argument (``length``: of a list of tensors): its tensors are among
    the saved tensors, taken back in order."""

    def __init__(self, length: int | None = None) -> None:
        self.length = length

    def take(self, saved):
        return next(saved) if self.length is None else [next(saved) for _ in range(self.length)]
