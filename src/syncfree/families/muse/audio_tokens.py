"""Muse's own rewrite helper (its ``Family.helpers``): Spark's valid audio tokens of each clip (``AUDIO_VALID_TOKENS``
in ``edits.py`` calls it).
"""

from __future__ import annotations

import torch

from ...plan import active

__all__ = ["valid_audio_tokens"]


def valid_audio_tokens(audio_features: torch.Tensor, token_mask: torch.Tensor, input_values_mask, samples_per_token):
    """``audio_features[token_mask]`` (Muse Spark: each clip's first ``ceil(real samples / samples_per_token)`` tokens):
    the same rows in the same order, taken by the positions of the mask's ones, whose count comes from the plan's host
    copy of that very ``input_values_mask`` (``index_select``: no read of the count, forward or backward)."""
    entry = None if torch.compiler.is_compiling() else active.current()
    host = entry.plan.host.get("input_values_mask") if entry is not None else None
    if (not isinstance(host, torch.Tensor) or entry.given.get("input_values_mask") is not input_values_mask
            or tuple(host.shape) != tuple(input_values_mask.shape) or token_mask.dim() != 2
            or tuple(token_mask.shape) != tuple(audio_features.shape[:2]) or host.shape[0] != token_mask.shape[0]):
        return audio_features[token_mask]
    lengths = host.sum(-1).tolist()  # (a host tensor: no device involved)
    count = sum(min(-(-n // samples_per_token), token_mask.shape[1]) for n in lengths)
    rows = audio_features.reshape(-1, *audio_features.shape[2:])
    # (nonzero_static: the mask's positions, their number given by the host; no read)
    return rows.index_select(0, torch.nonzero_static(token_mask.reshape(-1), size=count).reshape(-1))
