"""MiniCPM's merger in a traced forward of a stream (``Layout.stream``).

Stock's ``Merger.forward`` loops over the crops (``for batch_idx in range(len(target_sizes))``: a view, a permute and
the merge MLPs per crop), which Dynamo would unroll into a graph per layout, and cannot even start on a crop count it
keeps unbacked. In a traced stream forward the loop runs inside one operator (``syncfree::minicpm_merger``, made by
``recomputed_op``) that takes the plan's host crop sizes and calls the stock merger itself: the same calls in the same
order, so the features are the eager ones bit for bit (concatenated, as the forward concatenates them). Its output
rows are the kind's placeholders (the plan's size carrier).

An operator takes no module: the merger is found inside it by a key (``_key``: run once while Dynamo traces, a
constant of the graph), from a table that holds it weakly. Its weights are not the operator's inputs, so a traced
training step (the weights wanting gradients) keeps stock's loop.
"""

from __future__ import annotations

import weakref

import torch

from ...plan import active
from ...rewrite.recomputed_op import recomputed_op

__all__ = ["merged_crops"]

_MERGERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@torch._dynamo.assume_constant_result
def _key(merger) -> int:
    # (run by Dynamo while it traces, with the module itself: the key is a constant of the graph)
    _MERGERS[id(merger)] = merger
    return id(merger)


def _merge(hidden: torch.Tensor, sizes: torch.Tensor, merger: int) -> torch.Tensor:
    # (the instance's forward: the patched one, which outside a trace is stock's loop on these host sizes)
    return torch.cat(_MERGERS[merger](hidden, sizes), dim=0)


_merged = recomputed_op("syncfree::minicpm_merger", _merge,
                        lambda hidden, sizes, merger, rows: hidden.new_empty((rows.shape[0], _width(merger))),
                        sized_by=("rows",))


def _width(merger: int) -> int:
    return _MERGERS[merger].mlp[-1].linear_2.out_features


def merged_crops(merger, hidden_states: torch.Tensor, vp) -> list[torch.Tensor] | None:
    """Stock's per-crop features as one piece, ``[features]``, by one operator over ``vp``'s host crop sizes; None
    where stock's loop runs (a training step whose merger weights want gradients)."""
    if torch.is_grad_enabled() and any(p.requires_grad for p in merger.parameters()):
        return None
    entry = active.current()
    rows = entry.plan.carriers["n_image_tokens" if vp is entry.plan.image else "n_video_tokens"]
    return [_merged(hidden_states, vp.grid_thw[:, 1:], _key(merger), rows)]
