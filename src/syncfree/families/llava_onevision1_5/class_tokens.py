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

from ...rewrite.recomputed_op import recomputed_op

__all__ = ["class_tokens_prepended", "class_tokens_dropped"]


def _prepend(hidden: torch.Tensor, cls: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    cls = cls.to(hidden.dtype)
    return torch.cat([torch.cat((cls, frame)) for frame in hidden.split(lengths.tolist())])


def _drop(hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([frame[1:] for frame in torch.split(hidden, [n + 1 for n in lengths.tolist()])], dim=0)


_prepended = recomputed_op(
    "syncfree::class_tokens_prepended", _prepend,
    lambda hidden, cls, lengths: hidden.new_empty((hidden.shape[0] + lengths.shape[0], *hidden.shape[1:])),
    differentiable=2)
_dropped = recomputed_op(
    "syncfree::class_tokens_dropped", _drop,
    lambda hidden, lengths: hidden.new_empty((hidden.shape[0] - lengths.shape[0], *hidden.shape[1:])))


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
