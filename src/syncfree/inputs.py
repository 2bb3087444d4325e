"""Processor-style batches for every fully supported family, without a tokenizer or a download.

What a family's processor would return for a list of samples (text, images, videos, audio), laid out
as that processor lays it out; the builders live with their families (``syncfree.families``).

    batch = processor_batch(model.config, [[Text(10), Image(448, 448), Text(12)]])
"""

from __future__ import annotations

from .families import batch_to, processor_batch
from .families.omni.inputs import (
                                   OMNI_LAYOUT_NAMES,
                                   Audio,
                                   VideoWithAudio,
                                   audio_tokens,
                                   build_omni_inputs,
                                   is_omni,
                                   omni_forward_kwargs,
                                   omni_layout,
)
from .families.qwen3asr import ASR_LAYOUT_NAMES, asr_layout, build_asr_inputs, is_audio_only
from .families.qwen_vl.inputs import LAYOUT_NAMES, Image, Item, Text, Video, build_inputs, named_layout, pixel_inputs

__all__ = ["processor_batch", "batch_to", "Image", "Video", "Text", "Item", "Audio", "VideoWithAudio", "build_inputs",
           "build_omni_inputs", "named_layout", "omni_layout", "omni_forward_kwargs", "audio_tokens", "is_omni",
           "pixel_inputs", "LAYOUT_NAMES", "OMNI_LAYOUT_NAMES",
           "ASR_LAYOUT_NAMES", "asr_layout", "build_asr_inputs", "is_audio_only"]
