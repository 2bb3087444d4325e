"""Host copies of the masks a forward runs with: the padding mask (or a decode step's), from the active plan; and a
mask a family's helper built from the plan, made known for that very device mask to Transformers' SDPA shortcut check.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

from ..plan import active
from .roles import wrapper

__all__ = ["host_padding_mask", "knowing_host_mask", "known_host_mask", "make_ignore_bidirectional_mask_sdpa"]


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


_known = threading.local()


def known_host_mask(mask) -> torch.Tensor | None:
    """The host copy of ``mask`` (that very tensor) that a running ``knowing_host_mask`` knows, or None."""
    for device_mask, host in reversed(getattr(_known, "masks", None) or ()):
        if device_mask is mask:
            return host
    return None


@contextlib.contextmanager
def knowing_host_mask(device_mask: torch.Tensor, host: torch.Tensor):
    """While in the block, ``host`` is known as the host copy of ``device_mask`` (that very tensor): a family's helper
    that built the device mask from the plan's host copies says so around the call that checks it."""
    masks = _known.__dict__.setdefault("masks", [])
    masks.append((device_mask, host))
    try:
        yield
    finally:
        masks.pop()


@wrapper("answers 'is nothing padded?' of a bidirectional mask from a host copy known for it")
def make_ignore_bidirectional_mask_sdpa(stock):
    """Transformers' SDPA shortcut check of a bidirectional mask (``padding_mask.all()``: a read of the device),
    answered from a host copy known for that very mask (``knowing_host_mask``); stock's own check otherwise."""
    is_tracing = stock.__globals__.get("is_tracing")

    @functools.wraps(stock)
    def _ignore_bidirectional_mask_sdpa(padding_mask, *args, **kwargs):
        if (isinstance(padding_mask, torch.Tensor) and padding_mask.device.type != "cpu"
                and not torch.compiler.is_compiling() and not (is_tracing is not None and is_tracing(padding_mask))):
            host = known_host_mask(padding_mask)
            if host is not None and host.shape == padding_mask.shape:
                padding_mask = host
        return stock(padding_mask, *args, **kwargs)

    return _ignore_bidirectional_mask_sdpa
