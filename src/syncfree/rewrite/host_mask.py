"""The host copy of the padding mask a running forward or ``generate()`` call was given (its plan's), for helpers
that answer questions about that mask without reading the device."""

from __future__ import annotations

import torch

from ..plan import active

__all__ = ["host_padding_mask"]


def host_padding_mask(entry: active.Entry, padding_mask: torch.Tensor) -> torch.Tensor | None:
    """The host copy of a (rows, width) padding mask of the running forward or generate() call, or None.

    In the prefill that is the mask the plan was made from; in a decode step inside ``generate()``,
    that mask extended with ones, one column per new token (which is how generate() extends it)."""
    host = entry.plan.host_mask
    if host is None or padding_mask.dim() != 2 or padding_mask.shape[0] % host.shape[0]:
        return None
    rows, width = padding_mask.shape
    if rows != host.shape[0]:  # beams / num_return_sequences: generate() repeats each row
        host = host.repeat_interleave(rows // host.shape[0], dim=0)
    if width == host.shape[1] and isinstance(entry.attention_mask, torch.Tensor):
        return host  # the prefill: the mask the plan was made from
    if width > host.shape[1] and entry.in_generate:
        # A decode step: generate() extends the prompt's mask with ones, one column per new token.
        return torch.cat([host, host.new_ones(rows, width - host.shape[1])], dim=1)
    return None
