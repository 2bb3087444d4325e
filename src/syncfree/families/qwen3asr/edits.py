"""Qwen3-ASR's audio encoder and placeholders: the stock lines rewritten (``ASR_*``); the helper the valid-frame
select calls instead (``planned_valid_indices``) is the family's own, in ``valid_frames.py`` (its ``Family.helpers``).

The encoder wrapper (``wrappers.make_masked_audio_forward``) hands the stock forward the plan's windows
(``cu_seqlens``, which stock's ``get_audio_cu_seqlens`` pops; ``max_seqlen``, which ``get_max_seqlen`` pops, carrying
the window sizes to the split in every layer as ``AUDIO_ATTENTION`` reads them) and the positions of the valid output
frames. The placeholder count and the scatter are ``placeholder_count`` / ``placeholder_numel`` /
``scatter_features`` as every family's, spelt with this model's names.
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["ASR_VALID_FRAMES", "ASR_PLACEHOLDER_MASK", "ASR_SCATTER"]

# The valid output frames of the padded chunks, a nonzero (a read of the count): the plan's positions instead, made
# by the same line on the host copy of input_features_mask (``plan``). ``index_select`` with them then
# takes the very rows stock's takes.
ASR_VALID_FRAMES = (
    Edit("stmt", "valid_indices = valid_mask.flatten().nonzero().squeeze(-1)",
         "valid_indices = _syncfree.planned_valid_indices(valid_mask, kwargs)"),
)

# get_placeholder_mask: the count (printed in the check's message: a read) and the check's boolean select over the
# expanded mask (a read of its size), from the plan's count of audio placeholders.
ASR_PLACEHOLDER_MASK = (
    Edit("stmt", "n_audio_tokens = special_audio_mask.sum()",
         'n_audio_tokens = _syncfree.placeholder_count(input_ids, special_audio_mask, "audio")'),
    Edit("expr", "inputs_embeds[special_audio_mask].numel()",
         '_syncfree.placeholder_numel(inputs_embeds, special_audio_mask, input_ids, "audio")'),
)

# The forward's scatter of the audio features into their placeholders (as FEATURE_SCATTER).
ASR_SCATTER = (
    Edit("expr", "inputs_embeds.masked_scatter(special_audio_mask, audio_embeds.to(inputs_embeds.device, "
                 "inputs_embeds.dtype))",
         "_syncfree.scatter_features(inputs_embeds, special_audio_mask, audio_embeds.to(inputs_embeds.device, "
         'inputs_embeds.dtype), input_ids, "audio")'),
)
