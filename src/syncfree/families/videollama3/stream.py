"""VideoLLaMA3 in a traced forward of a stream (``Layout.stream``): its tower's ``pixel_unshuffle`` loops over the
items (``view`` / ``interpolate`` sized by each one's grid and merge size), which Dynamo would unroll into a graph per
layout. There it runs inside one operator (``syncfree::videollama3_unshuffle``) that takes the plan's host grid and
merge sizes (reading them waits for no device) and calls the stock method itself: the same calls in the same order,
so the outputs are the eager ones bit for bit. Its output rows are the features of the tower call's kind: the
placeholders of the images, the videos' features before their token compression (the compression mask's length);
its backward runs it again under autograd.
"""

from __future__ import annotations

import importlib

import torch

from ...plan import active
from ...rewrite.helpers import placeholder_carrier, traced_stream_plan
from ...rewrite.recomputed_op import recomputed_op

__all__ = ["unshuffled"]

_MODELING = "transformers.models.video_llama_3.modeling_video_llama_3"


def _unshuffle(hidden: torch.Tensor, grid: torch.Tensor, merges: torch.Tensor) -> torch.Tensor:
    # (the class's own method: the patched one is the instance's; it reads nothing of ``self``)
    return importlib.import_module(_MODELING).VideoLlama3VisionModel.pixel_unshuffle(None, hidden, grid, merges)


_unshuffle_op = recomputed_op("syncfree::videollama3_unshuffle", _unshuffle,
                              lambda hidden, grid, merges, rows: hidden.new_empty((rows.shape[0], hidden.shape[-1])),
                              sized_by=("rows",))


def _features(vp):
    """A tensor whose first size is the number of features of ``vp``'s kind: the images' placeholders, the videos'
    compression mask (or their placeholders without one)."""
    entry = active.current()
    if vp is entry.plan.video and entry.given.get("video_compression_mask") is not None:
        return entry.given["video_compression_mask"]
    return placeholder_carrier(vp)


def unshuffled(unshuffle, hidden_states: torch.Tensor, grid_thw: torch.Tensor, merge_sizes: torch.Tensor):
    """``unshuffle(hidden_states, grid_thw, merge_sizes)`` (stock's ``self.pixel_unshuffle``); in a traced stream
    forward one operator over the plan's host grid and merge sizes."""
    vp = traced_stream_plan(grid_thw)
    if vp is None or vp.merge_sizes is None:
        return unshuffle(hidden_states, grid_thw, merge_sizes)
    return _unshuffle_op(hidden_states, vp.grid_thw, vp.merge_sizes, _features(vp))
