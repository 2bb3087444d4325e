"""The stock lines syncfree rewrites in Muse Glimmer and Spark: the tower's blocks called per layer type, and Spark's
audio (its valid tokens by the family's own helper, ``audio_tokens.py``, its ``Family.helpers``).
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["BLOCK_KWARGS_BY_TYPE", "AUDIO_PLACEHOLDER_MASK", "AUDIO_SCATTER_EMBEDS", "AUDIO_VALID_TOKENS"]

# ``BLOCK_KWARGS``' pass-on (``rewrite/edits.py``) where the blocks are called with the segmentation of their layer
# type (Muse Glimmer / Spark: full and window layers): the plan's sizes of both segmentations reach every block, whose
# attention picks its own by count.
BLOCK_KWARGS_BY_TYPE = (
    Edit("stmt", """
         hidden_states = block(hidden_states, position_embeddings=position_embeddings,
                               cu_seqlens=cu_seqlens_mapping[self.config.layer_types[i]],)""", """
         hidden_states = block(hidden_states, position_embeddings=position_embeddings,
                               cu_seqlens=cu_seqlens_mapping[self.config.layer_types[i]],
                               **_syncfree.planned_kwargs(kwargs))"""),
)

# Muse Spark's audio: the placeholder count (as PLACEHOLDER_MASK), the scatter (as FEATURE_SCATTER) and the valid audio
# tokens of each clip, a boolean select (a read of the count) taken by the positions of the mask's ones instead, whose
# count the plan's host copy of ``input_values_mask`` gives.
AUDIO_PLACEHOLDER_MASK = (
    Edit("stmt", "n_audio_tokens = audio_mask.sum()",
         'n_audio_tokens = _syncfree.placeholder_count(input_ids, audio_mask, "audio")'),
)
AUDIO_SCATTER_EMBEDS = (
    Edit("expr", "inputs_embeds.masked_scatter(audio_mask, audio_embeds)",
         '_syncfree.scatter_features(inputs_embeds, audio_mask, audio_embeds, input_ids, "audio")'),
)
AUDIO_VALID_TOKENS = (
    Edit("stmt", "audio_features = audio_features[token_mask]",
         "audio_features = _syncfree.valid_audio_tokens(audio_features, token_mask, input_values_mask, "
         "samples_per_token)"),
)
