"""The stock line syncfree rewrites in VideoLLaMA3's forward: its video token compression, by the family's own helper
(``compression.py``, its ``Family.helpers``).
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["KEPT_VIDEO_FEATURES"]

# VideoLLaMA3's video token compression keeps the video features its processor's mask marks, by a boolean select (a
# read of the count): by the positions of the mask's ones instead, counted on the plan's host copy of that mask.
KEPT_VIDEO_FEATURES = (
    Edit("stmt", "video_embeds = video_embeds[video_compression_mask.to(video_embeds.device)]",
         "video_embeds = _syncfree.kept_video_features(video_embeds, video_compression_mask)"),
)
