"""The Omni thinkers' own rewrite helpers (their ``Family.helpers``): the mel frames ``get_audio_features`` keeps and
its per-clip lengths, from the plan's host copy of ``feature_attention_mask``; with the edit that calls them.
"""

from __future__ import annotations

import torch

from ...plan import active
from ...rewrite.rewriter import Edit

__all__ = ["AUDIO_FEATURES", "audio_lengths", "masked_frames", "audio_output_total"]

# Omni thinkers' get_audio_features: the mel frames kept by feature_attention_mask (boolean indexing:
# a read of the count) and the per-clip lengths, from the plan's host copy of that mask.
AUDIO_FEATURES = (
    Edit("stmt", "audio_feature_lengths = torch.sum(feature_attention_mask, dim=1)",
         "audio_feature_lengths = _syncfree.audio_lengths(feature_attention_mask)"),
    Edit("expr", "input_features.permute(0, 2, 1)[feature_attention_mask.bool()]",
         "_syncfree.masked_frames(input_features.permute(0, 2, 1), feature_attention_mask)"),
    # (Qwen2.5-Omni's check of the encoder's output length against the lengths it computed from the plan's host
    # lengths: host values in eager, which a traced forward cannot read)
    Edit("expr", "sum(audio_output_lengths.tolist())",
         "_syncfree.audio_output_total(audio_output_lengths, feature_attention_mask)", count=None),
)


def _audio_entry(feature_attention_mask):
    """The active plan's audio plan when ``feature_attention_mask`` is the very mask it was made from (in a traced
    forward too: the traced forward's own mask)."""
    entry = active.current()
    if entry is None or entry.plan.audio is None or feature_attention_mask is None:
        return None
    return entry.plan.audio if entry.given.get("feature_attention_mask") is feature_attention_mask else None


def audio_lengths(feature_attention_mask: torch.Tensor) -> torch.Tensor:
    """``torch.sum(feature_attention_mask, dim=1)`` (mel frames per clip): the plan's host copy, which the
    patched audio encoder recognises (so it lays the frames out without reading the device)."""
    audio = _audio_entry(feature_attention_mask)
    return torch.sum(feature_attention_mask, dim=1) if audio is None else audio.feature_lens


def masked_frames(features: torch.Tensor, feature_attention_mask: torch.Tensor) -> torch.Tensor:
    """``features[feature_attention_mask.bool()]`` for (clips, frames, bins) features: the same rows in the
    same order, taken by the plan's positions of the mask's ones (``index_select``: no read of the count)."""
    audio = _audio_entry(feature_attention_mask)
    if (audio is None or audio.frame_positions is None or features.dim() != 3
            or features.shape[:2] != feature_attention_mask.shape):
        return features[feature_attention_mask.bool()]
    return features.reshape(-1, features.shape[-1]).index_select(0, audio.frame_positions)


def audio_output_total(audio_output_lengths: torch.Tensor, feature_attention_mask) -> int:
    """``sum(audio_output_lengths.tolist())``: in a traced forward with a plan, the plan's count of encoder outputs
    (the sum of those lengths, which it computed from the same host lengths; a graph cannot read the values);
    stock's expression otherwise (host values: no sync)."""
    audio = _audio_entry(feature_attention_mask) if torch.compiler.is_compiling() else None
    if audio is None:
        return sum(audio_output_lengths.tolist())
    carrier = active.current().plan.carriers.get("n_audio_tokens")  # (a stream's graph: the count as a size)
    return audio.n_outputs if carrier is None else carrier.shape[0]
