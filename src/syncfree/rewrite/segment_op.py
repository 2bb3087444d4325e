"""Vision attention over the plan's segments as one opaque operator, for forwards that ``torch.compile`` traces
with dynamic shapes.

Eager, the patched attention splits q, k and v by the plan's host segment lengths and makes one stock attention
call per segment. Traced, that loop would be unrolled into the graph: one graph per number and length of segments,
so a stream of layouts recompiles until Dynamo's limit. Here the loop runs inside a custom operator instead
(``syncfree::segment_attention``) that takes the lengths as a host (CPU) tensor: reading it waits for no device,
Dynamo sees only its shape (dynamic), and the graph holds one call whatever the images. Inside, the very calls the
eager path makes, in the same order: the outputs are the eager ones bit for bit.

The backward is an operator too (``segment_attention_backward``): it runs the same per-segment calls again under
autograd and takes their gradients, so the gradients are the eager path's (at the cost of one more forward of the
vision attention, as activation checkpointing costs).
"""

from __future__ import annotations

import importlib
import types

import torch

from .recomputed_op import autograd_inside, laid_out_like, recomputed_op
from .segments import TracedWindows

__all__ = ["segment_attention_op", "op_applies", "segment_linear_op", "with_traced_windows"]


def _interface(implementation: str, modeling: str):
    """Stock's ``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)``, the
    eager function being the one of the attention's own modeling module."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = getattr(importlib.import_module(modeling), "eager_attention_forward", None)
    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager)


def _segments(q, k, v, lengths, implementation, modeling, scaling, groups):
    call = _interface(implementation, modeling)
    # What the stock call reads of its module (the key/value groups; no dropout and no attention sinks here: see
    # op_applies; an eager function that takes sinks reads the attribute whether or not the module has any).
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=False, training=False, sinks=None)
    sizes = lengths.tolist()  # a host tensor: no wait
    splits = [torch.split(t, sizes, dim=2) for t in (q, k, v)]
    outputs = [call(module, a, b, c, attention_mask=None, scaling=scaling, dropout=0.0, is_causal=False)[0]
               for a, b, c in zip(*splits)]
    return torch.cat(outputs, dim=1)


@torch.library.custom_op("syncfree::segment_attention", mutates_args=())
def _segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, implementation: str,
                       modeling: str, scaling: float | None, groups: int) -> torch.Tensor:
    with torch.no_grad():
        return _segments(q, k, v, lengths, implementation, modeling, scaling, groups)


@_segment_attention.register_fake
def _(q, k, v, lengths, implementation, modeling, scaling, groups):
    # (1, heads, n, d) in, (1, n, heads, d) out: what the attention functions return, concatenated over segments
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[3]))


@torch.library.custom_op("syncfree::segment_attention_backward", mutates_args=())
def _segment_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                lengths: torch.Tensor, implementation: str, modeling: str, scaling: float | None,
                                groups: int) -> list[torch.Tensor]:
    with autograd_inside(), torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = _segments(*leaves, lengths, implementation, modeling, scaling, groups)
        return [laid_out_like(g, t) for g, t in zip(torch.autograd.grad(out, leaves, grad), (q, k, v))]


@_segment_attention_backward.register_fake
def _(grad, q, k, v, lengths, implementation, modeling, scaling, groups):
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]


def _setup_context(ctx, inputs, output):
    q, k, v, lengths, implementation, modeling, scaling, groups = inputs
    ctx.save_for_backward(q, k, v, lengths)
    ctx.options = (implementation, modeling, scaling, groups)


def _backward(ctx, grad):
    q, k, v, lengths = ctx.saved_tensors
    dq, dk, dv = _segment_attention_backward(grad, q, k, v, lengths, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


_segment_attention.register_autograd(_backward, setup_context=_setup_context)


def op_applies(module) -> bool:
    """Whether the operator computes what the attention's own call would: an implementation the operator looks up as
    stock does (not flash, whose stock path takes ``cu_seqlens`` and never splits), no dropout in play (the
    backward runs the forward again), and no attention sinks (a parameter the operator does not take)."""
    config = getattr(module, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    dropout = getattr(module, "attention_dropout", getattr(module, "dropout", 0.0))
    return (implementation in ("sdpa", "eager") and getattr(module, "sinks", None) is None
            and (not module.training or not isinstance(dropout, float) or dropout == 0.0))


def segment_attention_op(module, qkv, lengths: torch.Tensor, scaling) -> torch.Tensor:
    """The concatenated per-segment attention outputs (1, n, heads, d) of ``module``'s own call over the segments of
    the host ``lengths``, as one operator."""
    q, k, v = qkv
    return _segment_attention(q, k, v, lengths, module.config._attn_implementation, type(module).__module__,
                              None if scaling is None else float(scaling),
                              int(getattr(module, "num_key_value_groups", 1)))


# A linear layer stock applies to each item's rows apart (a projector's per-image loop): one call per segment, as the
# eager loop makes them (a matmul over all rows at once rounds differently from one per item), inside one operator
# that takes the rows per segment as a host tensor, so a traced forward holds one call whatever the items.


def _linears(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.nn.functional.linear(part, weight, bias) for part in torch.split(x, lengths.tolist())])


_segment_linear = recomputed_op("syncfree::segment_linear", _linears,
                                lambda x, weight, bias, lengths: x.new_empty((x.shape[0], weight.shape[0])),
                                differentiable=3)


def segment_linear_op(linear: torch.nn.Linear, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``torch.cat([linear(part) for part in x.split(lengths)])`` (the rows per segment: a host tensor) as one
    operator."""
    return _segment_linear(x, linear.weight, linear.bias, lengths)


def with_traced_windows(kwargs: dict, attention, cu_seqlens: torch.Tensor, host: torch.Tensor, sizes: tuple) -> dict:
    """An audio encoder's planned ``kwargs`` for a traced forward: ``max_seqlen`` as ``TracedWindows`` (its windows
    as a host tensor, which the segment operator splits by) where ``attention``, one of its layers' attention, runs
    through the operator; as they are otherwise (flash attention reads ``max_seqlen`` as an int)."""
    return {**kwargs, "max_seqlen": TracedWindows(cu_seqlens, host, sizes)} if op_applies(attention) else kwargs
