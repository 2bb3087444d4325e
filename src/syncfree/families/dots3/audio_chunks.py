"""What dots3-note's rewritten audio code calls (the ``_syncfree`` name there): its packed chunks' frame mask (for the
SDPA mask shortcut), their valid frames and their grouping by sample for generate(), from the plan's host copies of
``chunk_sample_lengths`` and ``input_ids``.

Each helper takes the stock operands and returns what the stock expression returns; it uses the plan only when the
tensors it is handed are the very ones the plan was built from, and evaluates the stock expression otherwise (and
always while ``torch.compile`` traces).
"""

from __future__ import annotations

import torch

from ...plan import active
from ...rewrite.host_mask import knowing_host_mask
from .plan import chunk_groups

__all__ = ["chunk_attention_mask", "chunk_valid_tokens", "audio_chunk_groups"]


def _planned(name: str, given) -> tuple[active.Entry, torch.Tensor] | None:
    """The active plan and its host copy of input ``name``, where ``given`` is the call's very tensor of that name."""
    entry = None if torch.compiler.is_compiling() else active.current()
    host = entry.plan.host.get(name) if entry is not None else None
    if (not isinstance(host, torch.Tensor) or not isinstance(given, torch.Tensor) or entry.given.get(name) is not given
            or tuple(host.shape) != tuple(given.shape)):
        return None
    return entry, host


def _host_chunk_mask(padding_mask: torch.Tensor, chunk_sample_lengths, samples_per_token: int) -> torch.Tensor | None:
    """The host copy of the conv stem's (chunks, frames) mask of each chunk's first ``ceil(samples / samples_per_token)``
    frames (stock's expression on the plan's host lengths), or None where the plan does not describe it."""
    found = _planned("chunk_sample_lengths", chunk_sample_lengths)
    if (found is None or found[1].dim() != 1 or padding_mask.dtype != torch.bool or padding_mask.dim() != 2
            or found[1].shape[0] != padding_mask.shape[0]):
        return None
    token_lengths = (found[1] + samples_per_token - 1) // samples_per_token
    return torch.arange(padding_mask.shape[1])[None, :] < token_lengths[:, None]


def chunk_attention_mask(create, config, hidden_states: torch.Tensor, padding_mask: torch.Tensor, chunk_sample_lengths,
                         samples_per_token: int):
    """``create(config, hidden_states, padding_mask)`` (``create_bidirectional_mask`` of the chunks' frame mask), with
    that mask's host copy known to the SDPA shortcut check (``rewrite.host_mask.make_ignore_bidirectional_mask_sdpa``),
    which then asks "is nothing padded?" of the host copy, not the device."""
    host = _host_chunk_mask(padding_mask, chunk_sample_lengths, samples_per_token)
    if host is None:
        return create(config, hidden_states, padding_mask)
    with knowing_host_mask(padding_mask, host):
        return create(config, hidden_states, padding_mask)


def chunk_valid_tokens(hidden_states: torch.Tensor, padding_mask: torch.Tensor, chunk_sample_lengths,
                       samples_per_token: int) -> torch.Tensor:
    """``hidden_states[padding_mask.to(hidden_states.device)]``, the (chunks, frames) mask being each chunk's first
    ``(samples + samples_per_token - 1) // samples_per_token`` frames: the same rows in the same order, taken by the
    positions of the mask's ones, whose count the plan's host copy of ``chunk_sample_lengths`` gives
    (``index_select``: no read of the count, forward or backward)."""
    mask = padding_mask.to(hidden_states.device)
    host = _host_chunk_mask(mask, chunk_sample_lengths, samples_per_token)
    if host is None or tuple(mask.shape) != tuple(hidden_states.shape[:2]):
        return hidden_states[mask]
    count = int(host.sum())  # (a host tensor: no device involved)
    positions = torch.nonzero_static(mask.reshape(-1), size=count).reshape(-1)
    return hidden_states.reshape(-1, *hidden_states.shape[2:]).index_select(0, positions)


def audio_chunk_groups(chunk_boundaries: torch.Tensor, sample_boundaries: torch.Tensor, chunk_sample_lengths,
                       input_ids, audio_token_id: int, stride: int):
    """``chunk_boundaries, sample_boundaries, torch.searchsorted(chunk_boundaries, sample_boundaries)`` as generate()'s
    expansion of the packed chunks makes them, all three on the host from the plan's copies of the chunk lengths and
    input_ids (the same integers): stock's checks and ``.tolist()`` on them then read no device."""
    found = _planned("chunk_sample_lengths", chunk_sample_lengths)
    ids = found[0].plan.host.get("input_ids") if found is not None else None
    if (found is None or not found[0].owns(input_ids) or not isinstance(ids, torch.Tensor) or input_ids.numel() == 0
            or tuple(ids.shape) != tuple(input_ids.shape) or found[1].dim() != 1):
        return chunk_boundaries, sample_boundaries, torch.searchsorted(chunk_boundaries, sample_boundaries)
    return chunk_groups(found[1], (ids == audio_token_id).sum(-1), stride)
