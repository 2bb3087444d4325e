"""dots3-note's part of a plan (its ``PlanHooks``): its packed audio chunks, and how its ``generate()`` groups them.

Its feature extractor cuts each clip into chunks (of at most ``chunk_length`` seconds) and packs the chunks of the
whole batch along one axis, with ``chunk_sample_lengths`` (samples per chunk); a chunk of ``n`` samples yields
``ceil(n / samples_per_token)`` audio placeholders. For beams, stock's ``_expand_inputs_for_generation`` groups the
chunks by sample (cumulative tokens against cumulative placeholders, ``searchsorted``) and repeats each sample's group.
The same integer arithmetic on the plan's host copies gives the same groups without reading the device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...plan.batch import expanded_inputs
from ...plan.hooks import PlanHooks

__all__ = ["chunk_groups", "expanded_chunk_lengths", "PLAN"]


def chunk_groups(chunk_sample_lengths: torch.Tensor, placeholders_per_row: torch.Tensor,
                 stride: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunks' token boundaries, the rows' placeholder boundaries and where each row's chunks begin, computed as
    stock computes them (its expressions, on host tensors)."""
    chunk_tokens = (chunk_sample_lengths + stride - 1) // stride
    chunk_boundaries = F.pad(chunk_tokens.cumsum(0), (1, 0))
    sample_boundaries = F.pad(placeholders_per_row.cumsum(0), (1, 0))
    return chunk_boundaries, sample_boundaries, torch.searchsorted(chunk_boundaries, sample_boundaries)


def expanded_chunk_lengths(chunk_sample_lengths: torch.Tensor, input_ids: torch.Tensor, audio_token_id: int,
                           stride: int, k: int) -> torch.Tensor | None:
    """``chunk_sample_lengths`` as stock's generate() expands them for ``k`` copies of each row: each row's chunks,
    repeated ``k`` times, row after row. None where stock refuses the grouping (its chunks do not end at row ends)."""
    chunk_boundaries, sample_boundaries, offsets = chunk_groups(
        chunk_sample_lengths, (input_ids == audio_token_id).sum(-1), stride)
    chunks = len(chunk_boundaries) - 1
    if offsets[-1] != chunks or not torch.equal(chunk_boundaries[offsets.clamp(max=chunks)], sample_boundaries):
        return None
    groups = torch.arange(chunks).split(offsets.diff().tolist())
    return chunk_sample_lengths.index_select(0, torch.cat([g.repeat(k) for g in groups]))


def expanded_with_chunks(plan, k: int) -> dict:
    """The shared expansion, and each row's chunks repeated ``k`` times, row after row, as its generate() repeats them
    (``PlanHooks.expand``)."""
    inputs, host = expanded_inputs(plan, k), plan.host
    if host["chunk_sample_lengths"] is not None and host["input_ids"] is not None:
        inputs["chunk_sample_lengths"] = expanded_chunk_lengths(host["chunk_sample_lengths"], host["input_ids"],
                                                                plan.spec.audio_token_id,
                                                                plan.spec.value("samples_per_token"), k)
    return inputs


def samples_per_token(config) -> dict:
    """The audio samples per placeholder (``PlanHooks.values``)."""
    return {"samples_per_token": config.audio_config.samples_per_token}


def feature_words(kind: str, tokens: int, features: int, spec) -> str:
    """Stock's words where placeholders and features disagree (one check for every modality)."""
    return f"Multimodal features and placeholder tokens do not match, tokens: {tokens}, features: {features}"


# ``chunk_sample_lengths``: the samples of each packed audio chunk, which give the frames each chunk keeps.
PLAN = PlanHooks(inputs=("chunk_sample_lengths",), expand=expanded_with_chunks, values=samples_per_token,
                 feature_words=feature_words)
