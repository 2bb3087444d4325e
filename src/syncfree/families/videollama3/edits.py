"""The stock lines syncfree rewrites in VideoLLaMA3: its video token compression, by the family's own helper
(``compression.py``, its ``Family.helpers``), and its per-item sizes, from the plan's integers in a traced forward.
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["KEPT_VIDEO_FEATURES", "PIXEL_UNSHUFFLE", "ITEM_SPLIT"]

# VideoLLaMA3's video token compression keeps the video features its processor's mask marks, by a boolean select (a
# read of the count): by the positions of the mask's ones instead, counted on the plan's host copy of that mask.
KEPT_VIDEO_FEATURES = (
    Edit("stmt", "video_embeds = video_embeds[video_compression_mask.to(video_embeds.device)]",
         "video_embeds = _syncfree.kept_video_features(video_embeds, video_compression_mask)"),
)

# The tower's pixel_unshuffle splits its output per item and loops over the grid rows and merge sizes (host tensors on
# the eager path: no sync); a traced forward takes those integers from the plan instead (the same values).
PIXEL_UNSHUFFLE = (
    Edit("expr", "grid_thw.prod(dim=1).tolist()", "_syncfree.grid_products(grid_thw)"),
    Edit("expr", "zip(hidden_states_chunks, grid_thw, merge_sizes)",
         "zip(hidden_states_chunks, _syncfree.grid_rows(grid_thw), _syncfree.merge_values(merge_sizes))"),
)

# get_image_features (videos' too: get_video_features calls it) splits the features per item the same way.
ITEM_SPLIT = (
    Edit("expr", "split_sizes.tolist()",
         "_syncfree.item_split_sizes(split_sizes, image_grid_thw, image_merge_sizes, image_embeds)"),
)
