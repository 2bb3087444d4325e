"""VideoLLaMA3's own rewrite helper (its ``Family.helpers``): the video features its token compression keeps.

The forward keeps the video features its processor's ``video_compression_mask`` marks with a boolean select (a read of
the count); the helper (``KEPT_VIDEO_FEATURES`` in ``edits.py`` calls it) takes them by the positions of the mask's
ones, counted on the plan's host copy of that mask.
"""

from __future__ import annotations

import torch

from ...plan import active

__all__ = ["kept_video_features"]

def kept_video_features(video_embeds: torch.Tensor, video_compression_mask: torch.Tensor) -> torch.Tensor:
    """``video_embeds[video_compression_mask.to(video_embeds.device)]`` (VideoLLaMA3's token compression): the same
    rows in the same order, taken by the positions of the mask's ones, whose count the plan's host copy of that
    very mask gives (``index_select``: no read of the count, forward or backward)."""
    entry = active.current()
    carrier = entry.plan.carriers.get("n_video_tokens") if entry is not None else None
    if (torch.compiler.is_compiling() and carrier is not None
            and entry.given.get("video_compression_mask") is video_compression_mask):
        # (a traced forward of a stream: as many kept features as video placeholders, a size Dynamo keeps symbolic)
        positions = torch.nonzero_static(video_compression_mask.to(video_embeds.device).reshape(-1),
                                         size=carrier.shape[0]).reshape(-1)
        return video_embeds.index_select(0, positions)
    entry = None if torch.compiler.is_compiling() else entry
    host = entry.plan.host.get("video_compression_mask") if entry is not None else None
    if (not isinstance(host, torch.Tensor) or entry.given.get("video_compression_mask") is not video_compression_mask
            or video_compression_mask.dtype != torch.bool or host.dtype != torch.bool
            or tuple(video_compression_mask.shape) != tuple(host.shape)
            or tuple(host.shape) != (video_embeds.shape[0],)):
        return video_embeds[video_compression_mask.to(video_embeds.device)]
    count = int(host.sum())  # (a host tensor: no device involved)
    # (nonzero_static: the mask's positions, their number given by the host; no read)
    positions = torch.nonzero_static(video_compression_mask.to(video_embeds.device).reshape(-1), size=count).reshape(-1)
    return video_embeds.index_select(0, positions)
