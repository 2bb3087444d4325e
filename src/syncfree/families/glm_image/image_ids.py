"""GLM-Image's own rewrite helper (its ``Family.helpers``): the VQ codes its forward writes into ``input_ids``, and
whether the ids that makes still have the plan's rotary positions (``IMAGE_IDS_SCATTER`` in ``edits.py`` calls it).
"""

from __future__ import annotations

import torch

from ...plan import active

__all__ = ["scatter_image_ids"]


def scatter_image_ids(input_ids: torch.Tensor, mask: torch.Tensor, image_ids: torch.Tensor) -> torch.Tensor:
    """``input_ids.masked_scatter(mask, image_ids)`` (GLM-Image writes its source images' VQ codes into their
    placeholders). Where the active plan was built from these input_ids and no code can be an image start or end id
    (the codebook is smaller than both: the only ids its rotary index reads), the new ids have the plan's positions:
    the active entry says so (``Entry.rope_ids``), so the index answers from the plan."""
    scattered = input_ids.masked_scatter(mask, image_ids)
    entry = None if torch.compiler.is_compiling() else active.current()
    config = entry.plan.spec.config if entry is not None else None
    if entry is not None and entry.owns(input_ids) and config is not None:
        codes = getattr(getattr(config, "vq_config", None), "num_embeddings", None)
        markers = (getattr(config, "image_start_token_id", None), getattr(config, "image_end_token_id", None))
        if isinstance(codes, int) and all(isinstance(m, int) and m >= codes for m in markers):
            entry.rope_ids = scattered
    return scattered
