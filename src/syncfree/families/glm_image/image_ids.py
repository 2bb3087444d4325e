"""GLM-Image's own rewrite helper (its ``Family.helpers``): the VQ codes its forward writes into ``input_ids``, and
whether the ids that makes still have the plan's rotary positions (``IMAGE_IDS_SCATTER`` in ``edits.py`` calls it).
"""

from __future__ import annotations

import torch

from ...plan import active
from ...rewrite.helpers import grid_products, placeholder_count, traced_grid_rows

__all__ = ["scatter_image_ids", "source_feature_sizes", "source_grid_row", "placeholder_codes_count", "traced_item_sizes"]


def scatter_image_ids(input_ids: torch.Tensor, mask: torch.Tensor, image_ids: torch.Tensor) -> torch.Tensor:
    """``input_ids.masked_scatter(mask, image_ids)`` (GLM-Image writes its source images' VQ codes into their
    placeholders). Where the active plan was built from these input_ids and no code can be an image start or end id
    (the codebook is smaller than both: the only ids its rotary index reads), the new ids have the plan's positions:
    the active entry says so (``Entry.rope_ids``), so the index answers from the plan."""
    scattered = input_ids.masked_scatter(mask, image_ids)
    entry = active.current()
    config = entry.plan.spec.config if entry is not None else None
    if entry is not None and entry.owns(input_ids) and config is not None:
        codes = getattr(getattr(config, "vq_config", None), "num_embeddings", None)
        markers = (getattr(config, "image_start_token_id", None), getattr(config, "image_end_token_id", None))
        if isinstance(codes, int) and all(isinstance(m, int) and m >= codes for m in markers):
            entry.rope_ids = scattered
    return scattered


def source_feature_sizes(grid_thw: torch.Tensor, merge_size: int):
    """``(image_grid_thw.prod(-1) // merge_size**2).tolist()``, the features of each source image: in a traced forward
    from the plan's rows of that grid (the source grids ``get_image_grids_for_generation`` made known), stock's
    expression otherwise (a host grid: no sync). Each image's features are then reshaped to its own grid, so they are
    split per image even where they follow the patches."""
    return [patches // merge_size**2 for patches in grid_products(grid_thw)]


def source_grid_row(grid_thw: torch.Tensor, index: int) -> list:
    """``image_grid_thw[index].tolist()``: from the plan's rows in a traced forward, stock's expression otherwise."""
    rows = traced_grid_rows(grid_thw)
    return grid_thw[index].tolist() if rows is None else list(rows[index])


def placeholder_codes_count(input_ids: torch.Tensor, mask: torch.Tensor, image_ids: torch.Tensor):
    """``special_image_mask.sum()``, compared by stock with the number of VQ codes (``image_ids.shape[0]``): the plan's
    count where it was built from these input_ids (``placeholder_count``). In a traced forward of a stream, where that
    count and the codes' number are two sizes (the placeholders' carrier; a sum over the images' heights and widths,
    ``VisionPlan.row_carriers``), the codes' number, asserted equal to the plan's count: ``prepare`` checked that the
    grids' features are the placeholders (stock's message where not), and Dynamo could not compare the two sizes."""
    count = placeholder_count(input_ids, mask, "image")
    if traced_item_sizes(input_ids) is None:  # (eager, or a graph of one layout: two ints)
        return count
    torch._check(count == image_ids.shape[0])
    return image_ids.shape[0]


def traced_item_sizes(input_ids: torch.Tensor | None = None):
    """The active plan's images (its ``VisionPlan``) in a traced forward of a stream, where each source image's
    height and width are sizes (``VisionPlan.row_carriers``) and, given ``input_ids``, the plan was built from them;
    ``None`` otherwise (eager, or a graph of one layout)."""
    entry = active.current() if torch.compiler.is_compiling() else None
    if entry is None or (input_ids is not None and not entry.owns(input_ids)):
        return None
    vp = entry.plan.image
    return vp if vp is not None and vp.row_carriers else None
