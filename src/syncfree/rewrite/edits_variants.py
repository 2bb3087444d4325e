"""Variants of the stock lines syncfree rewrites: the core edits (``edits.py``) as later families spell them, and the
text models' data-dependent selections. Checked against the installed Transformers like every edit. A family's edits
that call helpers of its own live in its folder with them (``syncfree.families.<family>``, its ``Family.helpers``).
"""

from __future__ import annotations

from .edits import VISION_ATTENTION
from .rewriter import Edit

__all__ = ["VISION_ATTENTION_SCALING", "PLACEHOLDER_NUMEL"]

# The same split where each segment's call passes only the scale (a tower attention whose block passes no mask): its
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
             max_seqlen=max_seqlen, module=self)"""),
)

# get_placeholder_mask checking the count by boolean select, ``inputs_embeds[mask].numel() == features.numel()``
# (some take the image line only): a read of the count every call. The plan's host
# count times the width instead (the same number, so the same check, message and exception).
PLACEHOLDER_NUMEL = (
    Edit("expr", "inputs_embeds[special_image_mask].numel()",
         '_syncfree.placeholder_numel(inputs_embeds, special_image_mask, input_ids, "image")'),
    Edit("expr", "inputs_embeds[special_video_mask].numel()",
         '_syncfree.placeholder_numel(inputs_embeds, special_video_mask, input_ids, "video")'),
)
