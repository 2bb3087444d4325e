"""LLaVA-OneVision-1.5's class token per frame in a traced forward of a stream (``Layout.stream``).

Stock prepends a learned class token to every frame (``prepend_cls``: a ``cat`` per frame, split by the per-frame
patch counts) and drops them again before its merger (a slice per frame): loops over the frames that Dynamo would
unroll into a graph per layout. In a traced stream forward the tower is handed the frame lengths as a host tensor
(``VisionPlan.host_seqlens`` less the class token) and each loop runs inside one operator that takes it
(``syncfree::class_tokens_prepended`` / ``syncfree::class_tokens_dropped``): the same ops in the same order, so
the values are the eager ones bit for bit; their backward runs them again under autograd.
"""

from __future__ import annotations

import torch

from ...rewrite.segment_op import autograd_inside, laid_out_like

__all__ = ["class_tokens_prepended", "class_tokens_dropped"]


def _prepend(hidden, cls, lengths):
    cls = cls.to(hidden.dtype)
    return torch.cat([torch.cat((cls, frame)) for frame in hidden.split(lengths.tolist())])


def _drop(hidden, lengths):
    return torch.cat([frame[1:] for frame in torch.split(hidden, [n + 1 for n in lengths.tolist()])], dim=0)


@torch.library.custom_op("syncfree::class_tokens_prepended", mutates_args=())
def _prepended(hidden: torch.Tensor, cls: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _prepend(hidden, cls, lengths)


@_prepended.register_fake
def _(hidden, cls, lengths):
    return hidden.new_empty((hidden.shape[0] + lengths.shape[0], *hidden.shape[1:]))


@torch.library.custom_op("syncfree::class_tokens_prepended_backward", mutates_args=())
def _prepended_backward(grad: torch.Tensor, hidden: torch.Tensor, cls: torch.Tensor,
                        lengths: torch.Tensor) -> list[torch.Tensor]:
    with autograd_inside(), torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (hidden, cls)]
        grads = torch.autograd.grad(_prepend(*leaves, lengths), leaves, grad)
        return [laid_out_like(g, t) for g, t in zip(grads, (hidden, cls))]


@_prepended_backward.register_fake
def _(grad, hidden, cls, lengths):
    return [torch.empty_like(hidden), torch.empty_like(cls)]


def _prepended_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _prepended_grad(ctx, grad):
    hidden, cls, lengths = ctx.saved_tensors
    d_hidden, d_cls = _prepended_backward(grad, hidden, cls, lengths)
    return d_hidden, d_cls, None


_prepended.register_autograd(_prepended_grad, setup_context=_prepended_context)


@torch.library.custom_op("syncfree::class_tokens_dropped", mutates_args=())
def _dropped(hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _drop(hidden, lengths)


@_dropped.register_fake
def _(hidden, lengths):
    return hidden.new_empty((hidden.shape[0] - lengths.shape[0], *hidden.shape[1:]))


@torch.library.custom_op("syncfree::class_tokens_dropped_backward", mutates_args=())
def _dropped_backward(grad: torch.Tensor, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    with autograd_inside(), torch.enable_grad():
        leaf = hidden.detach().requires_grad_(True)
        (d_hidden,) = torch.autograd.grad(_drop(leaf, lengths), [leaf], grad)
        return laid_out_like(d_hidden, hidden)


@_dropped_backward.register_fake
def _(grad, hidden, lengths):
    return torch.empty_like(hidden)


def _dropped_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _dropped_grad(ctx, grad):
    hidden, lengths = ctx.saved_tensors
    return _dropped_backward(grad, hidden, lengths), None


_dropped.register_autograd(_dropped_grad, setup_context=_dropped_context)


def class_tokens_prepended(hidden_states: torch.Tensor, cls_states: torch.Tensor, frame_lengths):
    """Stock's ``torch.cat([torch.cat((cls_states, frame)) for frame in hidden_states.split(frame_lengths)])``; one
    operator where ``frame_lengths`` is the traced stream's host tensor."""
    if isinstance(frame_lengths, torch.Tensor):
        return _prepended(hidden_states, cls_states, frame_lengths)
    return torch.cat([torch.cat((cls_states, frame)) for frame in hidden_states.split(frame_lengths)])


def class_tokens_dropped(hidden_states: torch.Tensor, frame_lengths):
    """Stock's ``torch.cat([frame[1:] for frame in torch.split(hidden_states, [length + 1 for length in
    frame_lengths])], dim=0)``; one operator where ``frame_lengths`` is the traced stream's host tensor."""
    if isinstance(frame_lengths, torch.Tensor):
        return _dropped(hidden_states, frame_lengths)
    return torch.cat([frame[1:] for frame in torch.split(hidden_states, [length + 1 for length in frame_lengths])],
                     dim=0)
