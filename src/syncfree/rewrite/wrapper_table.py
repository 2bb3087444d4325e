"""Every wrapper factory by the name a ``Target.wrap`` gives it (the Qwen-VL pieces and the audio ones)."""

from __future__ import annotations

from .audio_chunks import make_ignore_bidirectional_mask_sdpa
from .qsa import make_generation_masks
from .wrappers import (
                       make_generate,
                       make_get_rope_index,
                       make_host_rope_index,
                       make_ignore_causal_mask_sdpa,
                       make_model_forward,
                       make_vision_forward,
                       make_vision_forward_device_grid,
                       make_vision_forward_seqlens_only,
)
from .wrappers_audio import make_audio_forward, make_masked_audio_forward, make_omni_rope_index
from .wrappers_decode_cache import make_decode_cache_rope_index
from .wrappers_merges import make_vision_forward_item_merges
from .wrappers_navit import make_vision_forward_target_sizes

__all__ = ["WRAPPERS"]

WRAPPERS = {f.__name__: f for f in (make_model_forward, make_vision_forward, make_vision_forward_device_grid,
                                     make_vision_forward_seqlens_only,
                                     make_generate, make_get_rope_index, make_host_rope_index,
                                     make_ignore_causal_mask_sdpa, make_audio_forward, make_omni_rope_index,
                                     make_vision_forward_item_merges, make_generation_masks,
                                     make_vision_forward_target_sizes, make_masked_audio_forward,
                                     make_decode_cache_rope_index,
                                     make_ignore_bidirectional_mask_sdpa)}
