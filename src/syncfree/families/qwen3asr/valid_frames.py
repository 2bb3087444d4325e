"""Qwen3-ASR's own rewrite helper (its ``Family.helpers``): the positions of its audio encoder's valid output frames,
which its encoder wrapper (``wrappers.make_masked_audio_forward``) took from the plan.
"""

from __future__ import annotations

import torch

__all__ = ["planned_valid_indices"]


def planned_valid_indices(valid_mask: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """``valid_mask.flatten().nonzero().squeeze(-1)``: the positions the encoder wrapper took from the plan (popped
    from the encoder's ``kwargs``, so its layers never see them), where the plan's valid mask has this one's shape
    and device (in a traced forward: the traced forward's plan, as it is); stock's own nonzero otherwise."""
    planned = kwargs.pop("syncfree_valid_indices", None)
    if planned is not None:
        shape, indices = planned
        if torch.compiler.is_compiling():
            # (traced: the plan of the traced forward, whose mask the graph checked against the plan; comparing the
            # shapes would make a graph per chunk count)
            return indices
        if tuple(valid_mask.shape) == tuple(shape) and indices.device == valid_mask.device:
            return indices
    return valid_mask.flatten().nonzero().squeeze(-1)
