"""The stock lines syncfree rewrites, one list per patched function, each naming the exact stock code.

Every edit is checked against the installed Transformers before anything is patched: a release
that changes one of these lines (or adds a second copy) is refused, not patched blindly.
"""

from __future__ import annotations

from .rewriter import Edit

__all__ = ["CHUNK_DELTA_RULE", "PACKED_CHECK", "PACKED_SEQUENCES",
           "AUDIO_ATTENTION", "AUDIO_SCATTER", "FEATURE_SCATTER", "GENERIC_SPLIT",
           "RECURRENT_MASK", "VISION_ATTENTION", "PLACEHOLDER_MASK", "DEEPSTACK_MERGE", "DEEPSTACK_PROCESS",
           "GENERATION_POSITIONS", "ROPE_DELTAS_AFTER_CACHE", "SLIDING_WINDOW_TENSOR", "SLIDING_WINDOW_TAIL", "CONV_PREFILL",
           "LINEAR_LENGTH_TENSOR", "STATIC_LENGTH_TENSOR", "BLOCK_KWARGS", "VISION_ATTENTION_CAT",
           "VISION_ATTENTION_WEIGHTS", "VISION_ATTENTION_WEIGHTS_MASKED",
           "FEATURE_SCATTER_FEATURES", "FEATURE_SPLIT", "feature_split", "GRID_LIST"]


def _segment_split(sizes: str, choice: str) -> Edit:
    """Stock's split of q, k and v by segment, by ``split_segments`` with the sizes and the backend the attention
    finds as ``sizes`` and ``choice`` (expressions in its scope)."""
    return Edit("stmt", """
         splits = [torch.split(tensor, lengths.tolist(), dim=2) for tensor in (query_states, key_states, value_states)]
         """, f"""
         splits = _syncfree.split_segments(lengths, cu_seqlens, {sizes}, {choice},
                                           (query_states, key_states, value_states), self.training)""")


def _segment_calls(choice: str) -> Edit:
    """Stock's attention call per segment, by ``segment_attention`` with the backend ``choice`` (an expression)."""
    return Edit("stmt", """
         attn_outputs = [attention_interface(self, q, k, v, attention_mask=None, scaling=self.scaling,
                                             dropout=0.0 if not self.training else self.attention_dropout,
                                             is_causal=False, **kwargs)[0] for q, k, v in zip(*splits)]""", f"""
         attn_outputs = _syncfree.segment_attention(
             lambda q, k, v, attention_mask=None: attention_interface(
                 self, q, k, v, attention_mask=attention_mask, scaling=self.scaling,
                 dropout=0.0 if not self.training else self.attention_dropout, is_causal=False, **kwargs)[0],
             splits, (query_states, key_states, value_states), cu_seqlens, {choice},
             scaling=self.scaling, training=self.training, eager=self.config._attn_implementation == "eager",
             max_seqlen=max_seqlen, module=self)""")


# Vision attention, non-flash path: split the packed sequence by the plan's host segment lengths
# (passed down from the vision tower in kwargs) instead of reading cu_seqlens in every block.
# The per-segment attention calls go through the chosen backend (rewrite/attention.py; "split" is
# stock's own list of calls). Backends that attend over the whole packed sequence at once do not
# split it at all (so nothing there depends on the layout, which a bucketed compile relies on).
VISION_ATTENTION = (
    Edit("prepend", "", 'syncfree_seqlens = kwargs.pop("syncfree_seqlens", None)\n'
                        'syncfree_attention = kwargs.pop("syncfree_attention", None)'),
    _segment_split("syncfree_seqlens", "syncfree_attention"),
    _segment_calls("syncfree_attention"),
)

# The same split where the per-segment calls are concatenated in one statement (a SigLIP-style
# attention, whose scale and dropout attributes are named ``scale`` and ``dropout``).
VISION_ATTENTION_CAT = VISION_ATTENTION[:2] + (
    Edit("stmt", """
         attn_output = torch.cat([attention_interface(self, query, key, value, attention_mask=None, scaling=self.scale,
                                                      dropout=0.0 if not self.training else self.dropout,
                                                      is_causal=False, **kwargs)[0]
                                  for query, key, value in zip(*splits)], dim=1)""", """
         attn_output = torch.cat(_syncfree.segment_attention(
             lambda q, k, v, attention_mask=None: attention_interface(
                 self, q, k, v, attention_mask=attention_mask, scaling=self.scale,
                 dropout=0.0 if not self.training else self.dropout, is_causal=False, **kwargs)[0],
             splits, (query_states, key_states, value_states), cu_seqlens, syncfree_attention,
             scaling=self.scale, training=self.training, eager=self.config._attn_implementation == "eager",
             max_seqlen=max_seqlen, module=self), dim=1)"""),
)

# The same split where the per-segment calls are a loop that also collects each segment's attention weights
# (a SigLIP-style attention which returns them for output_attentions).
VISION_ATTENTION_WEIGHTS = VISION_ATTENTION[:2] + (
    Edit("stmt", """
         for q, k, v in zip(*splits):
             attn_output, attn_weight = attention_interface(self, q, k, v, attention_mask=None, scaling=self.scaling,
                                                            dropout=0.0 if not self.training else self.attention_dropout,
                                                            is_causal=False, **kwargs)
             attn_outputs.append(attn_output)
             attn_weights.append(attn_weight)""", """
         attn_outputs, attn_weights = _syncfree.segment_attention_with_weights(
             lambda q, k, v, attention_mask=None: attention_interface(
                 self, q, k, v, attention_mask=attention_mask, scaling=self.scaling,
                 dropout=0.0 if not self.training else self.attention_dropout, is_causal=False, **kwargs),
             splits, (query_states, key_states, value_states), cu_seqlens, syncfree_attention,
             scaling=self.scaling, training=self.training, eager=self.config._attn_implementation == "eager",
             max_seqlen=max_seqlen, module=self)"""),
)

# The same loop passing the attention's own mask argument and no dropout (a tower attention that takes one). Other backends
# hand each call their own mask; stock's split keeps the caller's.
VISION_ATTENTION_WEIGHTS_MASKED = VISION_ATTENTION[:2] + (
    Edit("stmt", """
         for q, k, v in zip(*splits):
             attn_output, attn_weight = attention_interface(self, q, k, v, attention_mask=attention_mask,
                                                            scaling=self.scaling, dropout=0.0, is_causal=False, **kwargs)
             attn_outputs.append(attn_output)
             attn_weights.append(attn_weight)""", """
         attn_outputs, attn_weights = _syncfree.segment_attention_with_weights(
             lambda q, k, v, attention_mask=attention_mask: attention_interface(
                 self, q, k, v, attention_mask=attention_mask, scaling=self.scaling, dropout=0.0, is_causal=False,
                 **kwargs),
             splits, (query_states, key_states, value_states), cu_seqlens, syncfree_attention,
             scaling=self.scaling, training=self.training, eager=self.config._attn_implementation == "eager",
             max_seqlen=max_seqlen, module=self, masked=attention_mask is not None)"""),
)

# A tower that calls its blocks without its own **kwargs: the plan's segment sizes and the chosen attention backend,
# which the wrapper hands the tower in kwargs, are passed on to the blocks (whose attention takes them, as in every
# other family); nothing else of the caller's kwargs is.
BLOCK_KWARGS = (
    Edit("stmt", """
         hidden_states = blk(hidden_states, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                             position_embeddings=position_embeddings,)""", """
         hidden_states = blk(hidden_states, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                             position_embeddings=position_embeddings, **_syncfree.planned_kwargs(kwargs))"""),
)

# The same split in a family syncfree does not plan for: the sizes are read once per tower call. The
# first edit replaces the line by itself: it only insists that `lengths` is what the split uses.
GENERIC_SPLIT = (
    Edit("stmt", "lengths = cu_seqlens[1:] - cu_seqlens[:-1]", "lengths = cu_seqlens[1:] - cu_seqlens[:-1]"),
    Edit("expr", "lengths.tolist()", "_syncfree.segment_lengths(lengths, cu_seqlens, None)"),
)

# get_placeholder_mask: the placeholder counts it checks against the features, as host ints
# (stock sums the masks on the device, formats the sum into its message and checks it there).
PLACEHOLDER_MASK = (
    Edit("stmt", "n_image_tokens = special_image_mask.sum()",
         'n_image_tokens = _syncfree.placeholder_count(input_ids, special_image_mask, "image")'),
    Edit("stmt", "n_video_tokens = special_video_mask.sum()",
         'n_video_tokens = _syncfree.placeholder_count(input_ids, special_video_mask, "video")'),
)

# get_image_features / get_video_features split the tower's features per item by sizes read from the grid: a host
# grid there (the patched forward's own) costs no sync, but a traced forward cannot take a value out of a tensor. The
# plan's per-item counts instead, when the grid is the one it was built from (else stock's expression).
def feature_split(merge: str, prod: str = "-1", kinds: tuple = ("image", "video")) -> tuple:
    """The split edits for a forward that spells the merge size as ``merge`` (``self.visual.spatial_merge_size``) and
    the product over the grid's columns as ``.prod(<prod>)``: one edit per kind, in the order given."""
    return tuple(Edit("expr", f"({kind}_grid_thw.prod({prod}) // {merge}**2).tolist()",
                      f"_syncfree.feature_split_sizes({kind}_grid_thw, {merge})") for kind in kinds)


FEATURE_SPLIT = feature_split("self.visual.spatial_merge_size")

# A tower that reads its grid's rows on the host (a convolution sized by it, a position table resampled to it): the
# plan's rows in a traced forward, where a graph cannot read them.
GRID_LIST = (Edit("expr", "grid_thw.tolist()", "_syncfree.grid_list(grid_thw)"),)

# *Model.forward puts the vision features into the placeholder rows with masked_scatter. Its forward
# does not sync, but its backward takes the features' gradient with masked_select (a host read of the
# output size): by planned positions with index_copy instead (backward: index_select), same values.
FEATURE_SCATTER = (
    Edit("expr", "inputs_embeds.masked_scatter(image_mask, image_embeds)",
         '_syncfree.scatter_features(inputs_embeds, image_mask, image_embeds, input_ids, "image")'),
    Edit("expr", "inputs_embeds.masked_scatter(video_mask, video_embeds)",
         '_syncfree.scatter_features(inputs_embeds, video_mask, video_embeds, input_ids, "video")'),
)

# The same scatter where the forward names the features ``image_features`` / ``video_features``.
FEATURE_SCATTER_FEATURES = (
    Edit("expr", "inputs_embeds.masked_scatter(image_mask, image_features)",
         '_syncfree.scatter_features(inputs_embeds, image_mask, image_features, input_ids, "image")'),
    Edit("expr", "inputs_embeds.masked_scatter(video_mask, video_features)",
         '_syncfree.scatter_features(inputs_embeds, video_mask, video_features, input_ids, "video")'),
)

# A *Model.forward with deepstack features, image and video in one batch: the deepstack features of both are
# merged in placeholder order with boolean masks; by positions instead.
DEEPSTACK_MERGE = (
    Edit("expr", "image_mask[visual_pos_masks]", "_syncfree.mask_at(image_mask, visual_pos_masks)"),
    Edit("expr", "video_mask[visual_pos_masks]", "_syncfree.mask_at(video_mask, visual_pos_masks)"),
    Edit("expr", "visual_pos_masks.sum()", "_syncfree.true_count(visual_pos_masks)"),
    Edit("stmt", "embed_joint[image_mask_joint, :] = img_embed",
         "_syncfree.put_rows(embed_joint, image_mask_joint, img_embed)"),
    Edit("stmt", "embed_joint[video_mask_joint, :] = vid_embed",
         "_syncfree.put_rows(embed_joint, video_mask_joint, vid_embed)"),
)

# A text model with deepstack features adds them at the visual positions of the first layers.
DEEPSTACK_PROCESS = (
    Edit("stmt", "local_this = hidden_states[visual_pos_masks, :] + visual_embeds",
         "local_this = _syncfree.rows_at(hidden_states, visual_pos_masks, visual_embeds.shape[0]) + visual_embeds"),
    Edit("stmt", "hidden_states[visual_pos_masks, :] = local_this",
         "_syncfree.put_rows_at(hidden_states, visual_pos_masks, local_this)"),
)

# generate()'s 3D position setup asks whether the prompt holds vision tokens past the cached part
# (Transformers >= 5.2x; the line is absent in older releases, where nothing is rewritten).
GENERATION_POSITIONS = (
    Edit("expr", "bool(mm_token_type_ids[:, past_length:].any())",
         "_syncfree.has_vision_tokens_after(mm_token_type_ids, past_length)"),
)

# compute_3d_position_ids asks whether the model keeps rope deltas before whether the cache is empty. Both are plain
# reads; asked the other way round, a forward without a cache never reads the model's rope deltas, so a traced forward
# does not guard on whether an earlier call left them (one graph less: the first call's).
ROPE_DELTAS_AFTER_CACHE = tuple(
    Edit("expr", f"self.rope_deltas is None or {length} == 0", f"{length} == 0 or self.rope_deltas is None", count=None)
    for length in ("cache_length", "past_key_values_length"))  # (the cache's length, as 5.25 and 5.17 name it)

# Transformers' padding mask for linear-attention (gated-DeltaNet, Mamba) layers asks whether the
# 2D mask is all ones, to skip the masking multiply (a text model with such layers).
RECURRENT_MASK = (
    Edit("expr", "torch.all(attention_mask == 1)", "_syncfree.all_ones(attention_mask)"),
)

# A *Model.forward with an audio encoder puts the audio features into the audio placeholders (as FEATURE_SCATTER).
AUDIO_SCATTER = (
    Edit("expr", "inputs_embeds.masked_scatter(audio_mask, audio_features)",
         '_syncfree.scatter_features(inputs_embeds, audio_mask, audio_features, input_ids, "audio")'),
)

# The audio encoder's attention: the same split and per-window calls as the vision attention's, by the window sizes
# the planned max_seqlen carries (a plain int or None without a plan: then read once per cu_seqlens tensor). In a
# traced encoder the planned max_seqlen carries the windows as a host tensor (``segments.TracedWindows``), and the
# windows run as one operator, as the towers' segments do: a graph that does not follow the windows.
AUDIO_ATTENTION = (
    Edit("stmt", "lengths = cu_seqlens[1:] - cu_seqlens[:-1]", "lengths = cu_seqlens[1:] - cu_seqlens[:-1]"),
    _segment_split("_syncfree.planned_sizes(max_seqlen)", "None"),
    _segment_calls("None"),
)

# Transformers' mask code asks, for a batch without a padding mask (training), whether its position ids
# restart inside a row (a padding-free packed batch): answered from the plan's host copy of those ids.
PACKED_CHECK = (
    Edit("expr", "(packed_sequence_mask[:, -1] == 0).all()", "_syncfree.none_packed(packed_sequence_mask, position_ids)"),
)

# Transformers' mask preparation, inside the forward of a padding-free packed batch (``syncfree.packing_collator``): the
# plan's sequence ids of the rows, where stock derives them from the text position ids on the device, and only for a
# call without a padding mask and without a cache (with one, stock's masks attend across the samples). The masks are
# then stock's own packed-sequence masks (block-diagonal causal, sliding windows likewise).
PACKED_SEQUENCES = (
    Edit("stmt", "return False, attention_mask, packed_sequence_mask, q_length, kv_length, q_offset, kv_offset",
         "return (False, attention_mask, _syncfree.packed_sequences(packed_sequence_mask, inputs_embeds, position_ids, "
         "q_length, kv_length), q_length, kv_length, q_offset, kv_offset)"),
)


def _host_scalar_move(attr: str) -> tuple[Edit, ...]:
    return (Edit("expr", f"self.{attr}.to(self.device)", f"_syncfree.host_scalar_to(self.{attr}, self.device)"),)


# A sliding-window layer of the generation cache moves its window size (a 0-d host tensor) to the device when
# it first sees keys: a blocking copy (the host waits for the stream) per sliding layer at every prefill.
# Made on the device by a fill instead, from the host value (no copy, no wait).
SLIDING_WINDOW_TENSOR = _host_scalar_move("_sliding_window_tensor")
# The same for the token count a cache layer keeps as a 0-d host tensor and moves to the device when it first sees
# a state (Transformers 5.25: a blocking copy per layer, in the static cache's layers and the linear-attention ones).
STATIC_LENGTH_TENSOR = _host_scalar_move("cumulative_length")
LINEAR_LENGTH_TENSOR = _host_scalar_move("cumulative_length_linear")
# A sliding-window layer keeps its last ``sliding_window - 1`` keys and values by a negative slice, whose length (the
# window's, or the whole text's where the text is shorter) Dynamo decides by a guard on the text's length: in a traced
# stream, a graph for texts shorter than the window and another for longer ones. Kept by ``window_tail`` instead: the
# same tokens, their count a symbolic min in a traced forward (no guard); stock's slice itself in eager.
SLIDING_WINDOW_TAIL = tuple(
    Edit("expr", f"full_{kind}_states[:, :, -self.sliding_window + 1:, :]",
         f"_syncfree.window_tail(full_{kind}_states, self.sliding_window)") for kind in ("key", "value"))
# A gated-DeltaNet layer scans its chunked delta rule in a Python loop over 64-token chunks, which Dynamo unrolls: in a
# traced stream, a graph per chunk count. The layer's call goes through ``chunk_delta_rule`` instead: in a traced stream
# forward the same call inside one operator, stock's function itself elsewhere. (The name, not the call's statement:
# Transformers' releases name the call's arguments and results differently.)
CHUNK_DELTA_RULE = (
    Edit("expr", "torch_chunk_gated_delta_rule", "_syncfree.chunk_delta_rule(torch_chunk_gated_delta_rule)"),
)

# A linear-attention layer pads a prefill shorter than its short convolution's kernel up to the kernel (the
# convolution's left context), deciding by the text's length: in a traced stream, a graph for texts shorter than the
# kernel and another for longer ones. Padded by ``conv_prefill`` instead: stock's branch itself in eager; traced, a pad
# of ``max(kernel - length, 0)`` tokens, a size Dynamo keeps symbolic (no guard on which is longer). The kept tail
# (the last ``kernel`` tokens, copied into the cache) goes through ``conv_tail``: traced, gathered rather than sliced,
# since Inductor's copy of a slice asks whether it is contiguous, which is whether the text was at most the kernel.
CONV_PREFILL = (
    Edit("stmt", """
        if not self.record_past and full_conv_states.shape[-1] < self.conv_kernel_size[state_idx]:
            padding_length = self.conv_kernel_size[state_idx] - full_conv_states.shape[-1]
            full_conv_states = torch.nn.functional.pad(full_conv_states, (padding_length, 0), value=0)""", """
        if not self.record_past:
            full_conv_states = _syncfree.conv_prefill(full_conv_states, self.conv_kernel_size[state_idx])"""),
    Edit("expr", "full_conv_states[..., -self.conv_kernel_size[state_idx]:]",
         "_syncfree.conv_tail(full_conv_states, self.conv_kernel_size[state_idx])"),
)
