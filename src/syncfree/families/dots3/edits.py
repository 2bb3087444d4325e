"""dots3-note's stock line edits: its placeholder check by any token id, its scatter of each kind's embeddings, and its
packed audio chunks (the encoder's valid frames and mask, generate()'s grouping by sample). Their helpers are the
family's own (``placeholders``, ``audio_chunks``).
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["PLACEHOLDER_BY_ANY_TOKEN_ID", "FEATURE_SCATTER_EMBEDDINGS", "AUDIO_CHUNK_TOKENS", "AUDIO_CHUNK_GROUPS"]

# dots3-note's get_placeholder_mask serves three kinds through ``token_id`` (images, videos, audio): its count and check
# by boolean select, from the plan's count of the kind that id names (stock's own where it names none).
PLACEHOLDER_BY_ANY_TOKEN_ID = (
    Edit("stmt", "n_tokens = special_mask.sum()",
         "n_tokens = _syncfree.placeholder_count_by_id(input_ids, special_mask, token_id)"),
    Edit("expr", "inputs_embeds[special_mask].numel()",
         "_syncfree.placeholder_numel_by_id(inputs_embeds, special_mask, input_ids, token_id)"),
)

# dots3-note's forward scatters each kind's ``*_embeddings``, cast to the text's dtype, into its own mask.
FEATURE_SCATTER_EMBEDDINGS = tuple(
    Edit("expr", f"inputs_embeds.masked_scatter({kind}_mask, {kind}_embeddings.to(inputs_embeds))",
         f'_syncfree.scatter_features(inputs_embeds, {kind}_mask, {kind}_embeddings.to(inputs_embeds), input_ids, '
         f'"{kind}")')
    for kind in ("image", "video", "audio"))

# dots3-note's audio encoder hands its adapter each chunk's first ceil(samples / samples_per_token) frames by a boolean
# select (a read of the count): by the positions of the mask's ones instead, counted on the plan's host copy of
# ``chunk_sample_lengths``, which also answers the SDPA mask shortcut's "nothing padded?" of those frames. And
# generate()'s expansion of packed audio chunks for beams groups them per sample on the device, then reads the groups
# (three waits): grouped on that host copy and the host input_ids instead.
AUDIO_CHUNK_TOKENS = (
    Edit("expr", "create_bidirectional_mask(self.config, hidden_states, padding_mask)",
         "_syncfree.chunk_attention_mask(create_bidirectional_mask, self.config, hidden_states, padding_mask, "
         "chunk_sample_lengths, self.conv_stem.samples_per_token)"),
    Edit("expr", "self.adapter(hidden_states[padding_mask.to(hidden_states.device)])",
         "self.adapter(_syncfree.chunk_valid_tokens(hidden_states, padding_mask, chunk_sample_lengths, "
         "self.conv_stem.samples_per_token))"),
)
AUDIO_CHUNK_GROUPS = (
    Edit("stmt", "chunk_offsets = torch.searchsorted(chunk_boundaries, sample_boundaries)",
         "chunk_boundaries, sample_boundaries, chunk_offsets = _syncfree.audio_chunk_groups(\n"
         "    chunk_boundaries, sample_boundaries, chunk_sample_lengths, input_ids, self.config.audio_token_id, stride)"),
)
