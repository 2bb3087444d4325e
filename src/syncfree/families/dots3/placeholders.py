"""dots3-note's placeholder check: one ``get_placeholder_mask(input_ids, inputs_embeds, features, token_id)`` serves
images, videos and audio through ``token_id``. Its count and boolean-select size come from the plan's count of the
kind that id names (the shared ``placeholder_count`` / ``placeholder_numel``), stock's own where it names none.
"""

from __future__ import annotations

import torch

from ...plan import active
from ...rewrite.helpers import placeholder_count, placeholder_numel

__all__ = ["placeholder_count_by_id", "placeholder_numel_by_id"]


def _kind_of_token(token_id) -> str | None:
    """The kind whose planned token id ``token_id`` is, for a ``get_placeholder_mask`` that serves every kind through
    one ``token_id`` (dots3-note's); None where no plan is active, or no kind or two kinds have that id."""
    entry = active.current()
    if entry is None:
        return None
    spec = entry.plan.spec
    kinds = [kind for kind, planned in (("image", spec.image_token_id), ("video", spec.video_token_id),
                                        ("audio", spec.audio_token_id)) if planned is not None and planned == token_id]
    return kinds[0] if len(kinds) == 1 else None


def placeholder_count_by_id(input_ids, mask: torch.Tensor, token_id):
    """``special_mask.sum()`` as ``placeholder_count``, the kind being the one whose planned token id that is."""
    kind = _kind_of_token(token_id)
    return mask.sum() if kind is None else placeholder_count(input_ids, mask, kind)


def placeholder_numel_by_id(inputs_embeds: torch.Tensor, mask: torch.Tensor, input_ids, token_id):
    """``inputs_embeds[special_mask].numel()`` as ``placeholder_numel``, the kind found by its token id."""
    kind = _kind_of_token(token_id)
    return inputs_embeds[mask].numel() if kind is None else placeholder_numel(inputs_embeds, mask, input_ids, kind)
