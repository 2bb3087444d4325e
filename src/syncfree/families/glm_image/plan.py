"""GLM-Image's part of a plan (its ``PlanHooks``): its grids hold the images it generates, not only those it sees.

Its processor lists, per sample, the source images' grids and then the grids of the images to generate (one in
image-to-image, a large and a small preview in text-to-image), and says how many rows each sample has in
``images_per_sample``. The forward hands its tower only the sources (``get_image_grids_for_generation``: each
sample's grids but its last), and its own rotary index places the prompt's positions and, for each row, the positions
of every token still to be generated (``_cached_decode_position_ids``, which each decode step slices). Both are stock's
own methods, run here on the plan's host copies (the index in NumPy, ``rope.grid_rope_numpy``, where it models the
layout): the same numbers, no device involved.
"""

from __future__ import annotations

import torch

from ...plan.batch import rows_repeated
from ...plan.hooks import PlanHooks
from ...plan.rope_stock import stock_on_host
from .rope import grid_rope_numpy

__all__ = ["PLAN"]

_ROPE_INPUTS = ("input_ids", "image_grid_thw", "images_per_sample", "attention_mask")


def source_grids(spec, host: dict, image_tokens: int) -> torch.Tensor | None:
    """The grids the tower sees (stock's ``get_image_grids_for_generation`` on the host copies); None where the tokens
    hold no image placeholder (text-to-image: no source image, the forward runs no tower)."""
    grid = host["image_grid_thw"]
    if grid is None or not image_tokens:
        return None
    found, _ = stock_on_host(spec.vision_module, spec.rope.host_class, spec.config, "get_image_grids_for_generation",
                             images_per_sample=host["images_per_sample"], image_grid_thw=grid)
    return found


def target_grid_rope(spec, host: dict) -> dict:
    """The Plan fields of stock's index on the host copies: positions and deltas as it returns them, and what it leaves
    on the model for the decode steps (``decode_position_ids``, ``prefill_len``). Where stock computes none (no ids or
    no grids: ``compute_3d_position_ids`` does not call it), none; where it raises, ``stock_rope`` (the forward runs
    stock's own index, which raises the same from the device)."""
    if host["input_ids"] is None or host["image_grid_thw"] is None:
        return dict(position_ids=None, rope_deltas=None)
    found = grid_rope_numpy(spec, host)  # (stock's numbers without its walk, where the layout is one it models)
    if found is not None:
        return found
    try:
        (positions, deltas), model = stock_on_host(spec.vision_module, spec.rope.host_class, spec.config,
                                                   "get_rope_index", **{n: host[n] for n in _ROPE_INPUTS})
    except (RuntimeError, ValueError, IndexError, TypeError):
        return dict(position_ids=None, rope_deltas=None, stock_rope=True)
    return dict(position_ids=positions, rope_deltas=deltas, decode_position_ids=model._cached_decode_position_ids,
                prefill_len=model._prefill_len)


def expanded_inputs(plan, k: int) -> dict:
    """The plan's inputs as generate() expands them for beams: every tensor repeated row by row (GenerationMixin's
    default, which GLM-Image keeps: its grids and ``images_per_sample`` too, whatever they then describe)."""
    return rows_repeated(plan.host, k)


def vq_words(name: str, tokens: int, features: int, spec) -> str:
    """Stock's words where the image placeholders and the codes disagree (its features are VQ codes)."""
    return f"Number of image placeholder tokens ({tokens}) does not match number of image tokens from VQVAE ({features})"


# ``images_per_sample``: the grid rows per sample, its sources and then its targets; read on the host with
# ``.tolist()``, as the grids are. Its index finds each image by its start and end ids (``rope_config``). Its forward
# returns a tensor per source image, each of its own grid's sides (``item_sizes``: a stream's graph per image count).
PLAN = PlanHooks(inputs=("images_per_sample",), host_only=("images_per_sample",), tower_grid=source_grids,
                 rope_config=("image_start_token_id", "image_end_token_id"),
                 positions=target_grid_rope, expand=expanded_inputs, feature_words=vq_words, item_sizes=True)
