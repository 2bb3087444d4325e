"""Ovis2.5's boundary-token count: stock checks ``(input_ids == boundary_token_id).sum()`` against the images it
embeds; the plan's host copy of ``input_ids`` gives that count without reading the device.
"""

from __future__ import annotations

import torch

from ...plan import active

__all__ = ["token_count"]


def token_count(input_ids, mask: torch.Tensor, token_id):
    """``mask.sum()`` for ``mask = input_ids == token_id`` (a count stock checks, Ovis2.5's boundary tokens): the
    count of ``token_id`` in the plan's host copy of these input_ids, a host int, when the active plan was built from
    them (the device's own sum otherwise)."""
    entry = None if torch.compiler.is_compiling() else active.current()
    host = entry.plan.host.get("input_ids") if entry is not None and entry.owns(input_ids) else None
    if not isinstance(host, torch.Tensor) or tuple(host.shape) != tuple(input_ids.shape) \
            or not isinstance(token_id, int) or mask.shape != input_ids.shape:
        return mask.sum()
    return int((host == token_id).sum())  # (a host tensor: no device involved)
