"""The part of a plan for a family with an audio encoder whose rotary index stock computes (``RotaryIndex.audio_class``):
that index run as stock's on the host, the audio encoder's plan, counts per row.

Kept apart from ``batch.py`` (which builds the ``Plan``): what such a batch adds to it.
"""

from __future__ import annotations

import numpy as np

from .audio import audio_plan
from .rope_stock import mm_counts_per_row, stock_rope_on_host
from .tensors import host_array

__all__ = ["audio_rope", "audio_fields"]


def audio_rope(spec, host: dict, mask, use_audio_in_video: bool):
    """Stock's index (audio and video interleaved by time) on the host; None where stock does not compute it (no 2D
    mask) or fails."""
    ids = host["input_ids"]
    if ids is None or mask is None:  # (stock's compute_3d_position_ids needs both too)
        return None
    if spec.hooks.rope_index is not None:  # (the family's NumPy form, where it models the batch: no token walk)
        found = spec.hooks.rope_index(spec, host, mask, use_audio_in_video=use_audio_in_video)
        if found is not None:
            return found
    features = host.get("feature_attention_mask")
    try:
        return stock_rope_on_host(spec.vision_module, spec.rope.audio_class, spec.config, ids, mask,
                                  host["image_grid_thw"], host["video_grid_thw"], use_audio_in_video,
                                  features.sum(dim=1) if features is not None else None, host.get("video_second_per_grid"))
    except Exception:  # inconsistent inputs: stock's own index reports it when the forward runs it
        return None


def audio_fields(spec, host: dict, use_audio_in_video: bool) -> dict:
    """The Plan fields such a batch adds: the audio encoder's plan, audio placeholders, counts per row."""
    ids, features = host["input_ids"], host["feature_attention_mask"]
    n_window, n_window_infer = spec.audio_window
    audio = audio_plan(features, spec.vision_module, n_window, n_window_infer) if features is not None else None
    images, videos, _ = mm_counts_per_row(ids, dict(spec.rope_key)) if ids is not None else ((), (), ())
    audio_tokens = int(np.count_nonzero(host_array(ids) == spec.audio_token_id)) if ids is not None else 0
    return dict(audio=audio, n_audio_tokens=audio_tokens,
                use_audio_in_video=use_audio_in_video, images_per_row=tuple(images), videos_per_row=tuple(videos))
