"""Ovis2.5's boundary-token count: stock checks ``(input_ids == boundary_token_id).sum()`` against the images it
embeds; the plan's host copy of ``input_ids`` gives that count without reading the device.

Eager, the count is taken from the plan's host copy when the forward's ``input_ids`` are the plan's. The plan counts
every boundary id once when it is built (``PlanHooks.fields``: ``Plan.family_counts``) and checks them against the
grids there, with stock's error; a traced forward, whose features come as one piece (its graph does not follow the
number of images), then finds stock's check holding by construction (``token_count``).
"""

from __future__ import annotations

import numpy as np
import torch

from ...plan import active
from ...plan.tensors import host_array

__all__ = ["token_count", "boundary_counts", "boundary_values"]

_COUNTS = "boundary_tokens"


def boundary_values(config) -> dict:
    """The config's four boundary token ids, in the order stock checks them (``PlanHooks.values``: kept in the spec,
    checked against the model)."""
    from .inputs import boundary_ids
    return {"boundary_ids": tuple(boundary_ids(config).items())}


def boundary_counts(spec, host: dict) -> dict:
    """How many of each boundary id the host ``input_ids`` hold (``PlanHooks.fields``), counted once per plan.

    A kind whose boundaries do not pair with its grid rows fails here with stock's error (its type, its words), in
    the order stock checks them: a traced forward could only fail inside Dynamo, whose own error hides the words."""
    ids = host.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        return {}
    values = host_array(ids)
    counts = {t: int(np.count_nonzero(values == t)) for _, t in spec.value("boundary_ids")}
    for name, token in spec.value("boundary_ids"):
        grid = host.get(f"{name.split('_')[0]}_grid_thw")
        if isinstance(grid, torch.Tensor) and counts[token] != grid.shape[0]:
            raise ValueError(f"Expected {grid.shape[0]} visual boundary tokens with id {token}, but found "
                             f"{counts[token]}.")
    return {"family_counts": {_COUNTS: counts}}


def token_count(input_ids, mask: torch.Tensor, token_id, pieces=None):
    """``mask.sum()`` for ``mask = input_ids == token_id`` (a count stock checks against ``pieces``, the features'
    pieces: Ovis2.5's boundary tokens): the count of ``token_id`` in the plan's host copy of these input_ids, a host
    int, when the active plan was built from them (the device's own sum otherwise).

    Traced, with the forward's own input_ids: ``pieces``. The plan checked these counts against the grid's rows when
    it was built (``boundary_counts``: stock's error otherwise), and the graph checks that the input_ids are the ones
    it was built from (their checksums), so stock's check holds; the features come as one piece there (the graph does
    not follow the number of images), which stock's comparison would otherwise count as one image."""
    entry = active.current()
    if entry is None or not isinstance(token_id, int) or not isinstance(input_ids, torch.Tensor) \
            or mask.shape != input_ids.shape:
        return mask.sum()
    if torch.compiler.is_compiling():
        counts = entry.plan.family_counts.get(_COUNTS, {})
        ours = entry.given.get("input_ids") is input_ids and token_id in counts and isinstance(pieces, int)
        return pieces if ours else mask.sum()
    host = entry.plan.host.get("input_ids") if entry.owns(input_ids) else None
    if not isinstance(host, torch.Tensor) or tuple(host.shape) != tuple(input_ids.shape):
        return mask.sum()
    return int((host == token_id).sum())  # (a host tensor: no device involved)
