"""A family's own 3D rotary index, computed by stock's own ``get_rope_index`` on host tensors.

An index that interleaves audio and video positions by time (audio in video, ``RotaryIndex.audio_class``), or a
family's own (``RotaryIndex.host_class``), reads its inputs token by token (``input_ids.tolist()``,
``.item()``-style branches on device counts): on the device that is dozens of waits per forward. On host tensors
the very same code waits for nothing, and its result is stock's by construction. The plan runs it once, on the
host, and moves the positions with the rest of the plan.
"""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import torch

from .tensors import host_array

__all__ = ["stock_rope_on_host", "stock_rope_index", "rope_config_key", "host_rope_key", "mm_counts_per_row",
           "stock_on_host"]

# What the stock index reads from the config (compared between a plan and the model it runs on).
_ROPE_FIELDS = ("image_token_id", "video_token_id", "audio_token_id", "vision_start_token_id", "audio_start_token_id",
                "position_id_per_seconds", "seconds_per_chunk")


def rope_config_key(config) -> tuple:
    values = [(name, getattr(config, name, None)) for name in _ROPE_FIELDS]
    audio = getattr(config, "audio_config", None)
    values.append(("audio_config.n_window", getattr(audio, "n_window", None)))
    values.append(("vision_config.spatial_merge_size", config.vision_config.spatial_merge_size))
    return tuple(values)


def host_rope_key(config, own: tuple[str, ...] = ()) -> tuple:
    """What a family's own index run by ``stock_rope_index`` reads from the config: the image token, the number of
    rotary axes (from ``mrope_section``) and the merge size, and the config attributes the family names (``own``:
    ``PlanHooks.rope_config``, e.g. its marker ids)."""
    rope = getattr(config.text_config, "rope_parameters", None) or {}
    section = rope.get("mrope_section")
    return (("image_token_id", getattr(config, "image_token_id", None)),
            ("text_config.mrope_section", tuple(section) if section is not None else None),
            ("vision_config.spatial_merge_size", getattr(config.vision_config, "spatial_merge_size", None)),
            *((name, getattr(config, name, None)) for name in own))


class _HostSelf:
    """Stands in for the model as ``self`` of the stock index: its config, and the class's own methods."""

    def __init__(self, cls: type, config) -> None:
        self._cls = cls
        self.config = config
        # (None where the vision config names none: such an index takes its merge from elsewhere in the config)
        self.spatial_merge_size = getattr(config.vision_config, "spatial_merge_size", None)

    def __getattr__(self, name: str):
        member = inspect.getattr_static(self._cls, name)
        if isinstance(member, staticmethod):
            return member.__func__
        if isinstance(member, classmethod):
            return member.__get__(None, self._cls)
        if callable(member):
            return inspect.unwrap(member).__get__(self, type(self))  # stock, also where the class is patched
        return member


def stock_rope_on_host(modeling: str, cls_name: str, config, input_ids: torch.Tensor, attention_mask,
                       image_grid_thw=None, video_grid_thw=None, use_audio_in_video: bool = False,
                       audio_seqlens=None, second_per_grids=None):
    """``get_rope_index`` exactly as stock computes it, from host tensors (no device involved)."""
    cls = getattr(importlib.import_module(modeling), cls_name)
    host = _HostSelf(cls, config)
    return host.get_rope_index(input_ids, image_grid_thw, video_grid_thw, attention_mask, use_audio_in_video,
                               audio_seqlens, second_per_grids)


def stock_rope_index(modeling: str, cls_name: str, config, **inputs):
    """A family's own ``get_rope_index`` exactly as stock computes it, from host tensors (no device involved): the
    inputs its signature names, by name (e.g. input_ids, mm_token_type_ids, image_grid_thw,
    attention_mask)."""
    cls = getattr(importlib.import_module(modeling), cls_name)
    taken = inspect.signature(inspect.unwrap(inspect.getattr_static(cls, "get_rope_index"))).parameters
    found, _ = stock_on_host(modeling, cls_name, config, "get_rope_index",
                             **{name: value for name, value in inputs.items() if name in taken})
    return found


def stock_on_host(modeling: str, cls_name: str, config, method: str, **inputs):
    """A method of the family's own class (``method``) exactly as stock computes it, from host tensors, and the stand-in
    it ran on: what the method left on ``self`` (an index that keeps decode positions) can be read there."""
    host = _HostSelf(getattr(importlib.import_module(modeling), cls_name), config)
    return getattr(host, method)(**inputs), host


def mm_counts_per_row(input_ids: torch.Tensor, config_key: dict) -> tuple[list[int], list[int], list[int]]:
    """Images, videos and audio clips per row, from the start tokens (an audio-in-video clip counts as both
    a video and a clip): what a row takes from the batch's grids and audio features. (In NumPy over the whole
    (B, S) array: a few passes, not a few PyTorch ops per row.)"""
    vs, as_ = config_key["vision_start_token_id"], config_key["audio_start_token_id"]
    image, video = config_key["image_token_id"], config_key["video_token_id"]
    ids = host_array(input_ids)
    after = np.full_like(ids, -1)
    after[:, :-1] = ids[:, 1:]
    starts = ids == vs
    images = np.count_nonzero(starts & (after == image), axis=1)
    videos = np.count_nonzero(starts & ((after == video) | (after == as_)), axis=1)
    clips = np.count_nonzero(ids == as_, axis=1)
    return images.tolist(), videos.tolist(), clips.tolist()
