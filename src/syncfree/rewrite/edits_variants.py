"""The stock lines syncfree rewrites in the families issue 19 added (HunYuan-VL, MiniMax-M3-VL, Muse, dots3-note,
...): the core edits (``edits.py``) as each family spells them, and the text models' data-dependent selections.
Checked against the installed Transformers like every edit. A family's edits that call helpers of its own live in
its folder with them (``syncfree.families.<family>``, its ``Family.helpers``).
"""

from __future__ import annotations

from .edits import VISION_ATTENTION
from .rewriter import Edit

__all__ = ["VISION_ATTENTION_SCALING", "PLACEHOLDER_NUMEL", "BLOCK_KWARGS_BY_TYPE",
           "AUDIO_PLACEHOLDER_MASK", "AUDIO_SCATTER_EMBEDS", "AUDIO_VALID_TOKENS", "PLACEHOLDER_BY_ANY_TOKEN_ID",
           "FEATURE_SCATTER_EMBEDDINGS", "AUDIO_CHUNK_TOKENS", "AUDIO_CHUNK_GROUPS"]

# The same split where each segment's call passes only the scale (HunYuan-VL's and HY-V4-VL's tower attention): its
# block hands the attention ``attention_mask=None``, which reaches the call in ``kwargs``; a backend's own mask
# (block_diagonal) replaces it there.
VISION_ATTENTION_SCALING = VISION_ATTENTION[:2] + (
    Edit("stmt", """
         attn_outputs = [attention_interface(self, q, k, v, scaling=self.scaling, is_causal=False, **kwargs)[0]
                         for q, k, v in zip(*splits)]""", """
         attn_outputs = _syncfree.segment_attention(
             lambda q, k, v, attention_mask=None: attention_interface(
                 self, q, k, v, scaling=self.scaling, is_causal=False,
                 **(kwargs if attention_mask is None else {**kwargs, "attention_mask": attention_mask}))[0],
             splits, (query_states, key_states, value_states), cu_seqlens, syncfree_attention,
             scaling=self.scaling, training=self.training, eager=self.config._attn_implementation == "eager",
             max_seqlen=max_seqlen)"""),
)

# get_placeholder_mask checking the count by boolean select, ``inputs_embeds[mask].numel() == features.numel()``
# (MiniMax-M3-VL; HunYuan-VL takes the image line; survey 19 §A): a read of the count every call. The plan's host
# count times the width instead (the same number, so the same check, message and exception).
PLACEHOLDER_NUMEL = (
    Edit("expr", "inputs_embeds[special_image_mask].numel()",
         '_syncfree.placeholder_numel(inputs_embeds, special_image_mask, input_ids, "image")'),
    Edit("expr", "inputs_embeds[special_video_mask].numel()",
         '_syncfree.placeholder_numel(inputs_embeds, special_video_mask, input_ids, "video")'),
)

# The same pass-on where the blocks are called with the segmentation of their layer type (Muse Glimmer / Spark: full
# and window layers): the plan's sizes of both segmentations reach every block, whose attention picks its own by count.
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
