"""Placeholder counts for a ``get_placeholder_mask`` that serves every kind through a ``token_id`` (dots3-note's:
images, videos and audio), the kind being the one whose planned token id that is.

As ``helpers.placeholder_count`` / ``placeholder_numel``: the plan's host count where the active plan was built from
these input_ids and plans that kind, stock's own expression otherwise.
"""

from __future__ import annotations

import torch

from ..plan import active

__all__ = ["placeholder_count_by_id", "placeholder_numel_by_id"]


def _planned_count(input_ids, token_id) -> int | None:
    entry = None if torch.compiler.is_compiling() else active.current()
    if entry is None or not entry.owns(input_ids):
        return None
    plan, spec = entry.plan, entry.plan.spec
    counts = [(spec.image_token_id, plan.n_image_tokens), (spec.video_token_id, plan.n_video_tokens),
              (spec.audio_token_id, plan.n_audio_tokens)]
    found = [n for planned_id, n in counts if planned_id is not None and planned_id == token_id]
    return found[0] if len(found) == 1 else None  # (an id no kind, or two kinds, are planned for: stock's count)


def placeholder_count_by_id(input_ids, mask: torch.Tensor, token_id):
    """``special_mask.sum()``: a host int when the active plan was built from these input_ids and counts the kind of
    ``token_id``."""
    count = _planned_count(input_ids, token_id)
    return mask.sum() if count is None else count


def placeholder_numel_by_id(inputs_embeds: torch.Tensor, mask: torch.Tensor, input_ids, token_id):
    """``inputs_embeds[special_mask].numel()`` for that mask expanded over the hidden width: the plan's host count
    times that width."""
    count = _planned_count(input_ids, token_id)
    if count is None or mask.dtype != torch.bool or mask.shape != inputs_embeds.shape:
        return inputs_embeds[mask].numel()
    return count * inputs_embeds.shape[-1]
