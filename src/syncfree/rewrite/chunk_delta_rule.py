"""A gated-DeltaNet text model's chunked delta rule in a traced forward of a stream (``Layout.stream``).

Stock's ``torch_chunk_gated_delta_rule`` pads the text to whole chunks of 64 tokens and scans them in a Python loop
(``for i in range(num_chunks)``), which Dynamo unrolls: a graph per chunk count, so texts of up to 64, 128, ...
tokens each compile apart (and one chunk also specialises a size of 1: ``decay.cumsum(dim=3)`` broadcasts it). In a
traced stream forward the call runs inside one operator (``syncfree::chunk_delta_rule``, made by ``recomputed_op``):
the very function stock calls, with the same arguments, so the outputs are the eager ones bit for bit; its backward
runs it again under autograd. A custom operator returns one tensor: where stock also returns the final state (a
forward with a cache), the output and the state come packed in one float32 vector (the state's dtype: the output's
converts there and back exactly) and are viewed apart after it.

Anything else (packed sequences' ``cu_seqlens``, an eager forward) calls stock's function as it is. The edit that
routes a layer's call through here is ``edits.CHUNK_DELTA_RULE``.
"""

from __future__ import annotations

import functools

import torch

from ..plan import active
from ..plan.spec import layout_of
from .op_keys import key_of, keyed
from .recomputed_op import recomputed_op

__all__ = ["chunk_delta_rule"]


def _rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
          initial_state: torch.Tensor | None, rule: int, final: bool, l2norm: bool) -> torch.Tensor:
    out, state = keyed(rule)(query, key, value, g=g, beta=beta, initial_state=initial_state, output_final_state=final,
                      use_qk_l2norm_in_kernel=l2norm)
    return torch.cat([out.reshape(-1).to(state.dtype), state.reshape(-1)]) if final else out


def _sizes(key: torch.Tensor, value: torch.Tensor) -> tuple:
    # (stock's output (b, s, value heads, value dim), its state (b, value heads, key dim, value dim))
    b, s, _, dk = key.shape
    hv, dv = value.shape[-2:]
    return (b, s, hv, dv), (b, hv, dk, dv)


def _fake(query, key, value, g, beta, initial_state, rule, final, l2norm):
    out, state = _sizes(key, value)
    if not final:
        return query.new_empty(out)
    return query.new_empty((out[0] * out[1] * out[2] * out[3] + state[0] * state[1] * state[2] * state[3],),
                           dtype=torch.float32)


_chunked = recomputed_op("syncfree::chunk_delta_rule", _rule, _fake, differentiable=6)


def _traced(stock, query, key, value, g, beta, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    if cu_seqlens is not None:  # (packed sequences: the kernel's own path, or its error)
        return stock(query, key, value, g=g, beta=beta, initial_state=initial_state,
                     output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     cu_seqlens=cu_seqlens, **kwargs)
    # (stock's wrapper drops the keyword arguments its implementation does not take: ``kwargs`` goes nowhere)
    packed = _chunked(query, key, value, g, beta, initial_state, key_of(stock),
                      bool(output_final_state), bool(use_qk_l2norm_in_kernel))
    if not output_final_state:
        return packed, None
    out, state = _sizes(key, value)
    n = out[0] * out[1] * out[2] * out[3]
    return packed[:n].view(out).to(query.dtype), packed[n:].view(state)


def chunk_delta_rule(stock):
    """``torch_chunk_gated_delta_rule`` as the stock forward calls it: in a traced forward of a stream, a function of
    the same arguments that runs it inside one operator; else stock's own."""
    entry = active.current() if torch.compiler.is_compiling() else None
    layout = layout_of(entry.plan.spec.model_type) if entry is not None else None
    if layout is None or not layout.stream:
        return stock
    return functools.partial(_traced, stock)
