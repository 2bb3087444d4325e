"""The stock lines syncfree rewrites in GLM-Image, an autoregressive image generator (survey 19 §4): its tower calls its
blocks without kwargs, and its forward writes each source image's VQ codes into the placeholders of ``input_ids``
(no embedding scatter). Checked against the installed Transformers like every edit.
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["BLOCK_KWARGS_NO_POSITIONS", "PLACEHOLDER_IDS_CHECK", "IMAGE_IDS_SCATTER", "SOURCE_FEATURES"]

# The tower calls its blocks with neither its own **kwargs nor position embeddings (its learned positions are added
# before the blocks): the plan's segment sizes and the chosen attention backend, which the wrapper hands the tower in
# kwargs, are passed on to the blocks, whose attention takes them (as ``BLOCK_KWARGS`` does for GLM-OCR).
BLOCK_KWARGS_NO_POSITIONS = (
    Edit("stmt", "hidden_states = blk(hidden_states, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)",
         "hidden_states = blk(hidden_states, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, "
         "**_syncfree.planned_kwargs(kwargs))"),
)

# get_placeholder_mask compares the placeholders' device sum with the number of VQ codes (an ``if`` on a device
# tensor): the plan's host count instead (``image_ids.placeholder_codes_count``; in a stream's graph, the codes' number
# asserted equal to it). Its message formats the count with ``.item()``: ``int()`` gives the same text for the host
# int and for stock's tensor.
PLACEHOLDER_IDS_CHECK = (
    Edit("stmt", "n_placeholder_tokens = special_image_mask.sum()",
         "n_placeholder_tokens = _syncfree.placeholder_codes_count(input_ids, special_image_mask, image_ids)"),
    Edit("expr", "n_placeholder_tokens.item()", "int(n_placeholder_tokens)"),
)

# The forward writes the VQ codes into input_ids (no sync), then computes the rotary positions from those ids: the
# same scatter, after which the new ids are known to have the plan's positions (its index reads only the image start
# and end ids, which no code can be where the codebook is smaller than both).
IMAGE_IDS_SCATTER = (
    Edit("stmt", "input_ids = input_ids.masked_scatter(special_image_mask, image_ids)",
         "input_ids = _syncfree.scatter_image_ids(input_ids, special_image_mask, image_ids)"),
)

# get_image_features splits the tower's features per source image and reshapes each to its grid, by sizes read from the
# grid: host values in eager (the patched forward's own), which a traced forward cannot read; there the plan's rows of
# the source grids (``image_ids.source_feature_sizes`` / ``source_grid_row``).
SOURCE_FEATURES = (
    Edit("expr", "(image_grid_thw.prod(-1) // self.visual.spatial_merge_size**2).tolist()",
         "_syncfree.source_feature_sizes(image_grid_thw, self.visual.spatial_merge_size)"),
    Edit("expr", "image_grid_thw[i].tolist()", "_syncfree.source_grid_row(image_grid_thw, i)"),
)
