"""Processor-style batches for every fully supported family, without a tokenizer or a download.

What a family's processor would return for a list of samples (text, images, videos, audio), laid out
as that processor lays it out. The items and the skeleton every builder runs are ``syncfree.items``; each
builder's own part lives with its family (``syncfree.families``).

    batch = processor_batch(model.config, [[Text(10), Image(448, 448), Text(12)]])
"""

from __future__ import annotations

import random

from .families import batch_to, processor_batch
from .families.omni.inputs import (
    OMNI_LAYOUT_NAMES,
    VideoWithAudio,
    audio_tokens,
    build_omni_inputs,
    is_omni,
    omni_forward_kwargs,
    omni_layout,
)
from .families.qwen3asr import ASR_LAYOUT_NAMES, asr_layout, build_asr_inputs, is_audio_only
from .families.qwen_vl.inputs import LAYOUT_NAMES, build_inputs, named_layout
from .items import Audio, Image, Item, Text, Video, Waveform, check_items, pixel_inputs
from .plan.errors import InputsNotTaken
from .plan.spec import layout_of

__all__ = ["processor_batch", "batch_to", "Image", "Video", "Text", "Item", "Audio", "Waveform", "VideoWithAudio",
           "check_items", "build_inputs", "build_omni_inputs", "named_layout", "omni_layout", "omni_forward_kwargs",
           "audio_tokens", "is_omni", "pixel_inputs", "LAYOUT_NAMES", "OMNI_LAYOUT_NAMES",
           "ASR_LAYOUT_NAMES", "asr_layout", "build_asr_inputs", "is_audio_only", "stream_layouts",
           "audio_stream_layouts", "stream_batch"]


def stream_layouts(count: int, unit: int, rows: int = 2, videos: bool = True, seed: int = 0,
                   long_every: int = 0, audio: bool = False) -> list:
    """``count`` batches' samples as a training stream varies them: each of ``rows`` samples has text of 2-6 tokens
    and 0-3 images (sides of 1-3 ``unit`` by 2-3: at least two tokens each) or, where ``videos``, short videos (2 or
    4 frames), with text between; so the batches differ in image count and sizes, text length, padding, and in
    text-only rows. ``long_every``: every that many batches (from the first), its first sample opens with 64-400
    tokens of text instead (a size a text model may cut in chunks or windows: 64 and its multiples crossed).
    ``audio`` (a family that takes images and audio, the Omni thinkers): the first sample of every batch ends with a
    clip of 201-800 mel frames and text, every other sample by a coin toss with a clip of 30-800 (every batch has
    audio, more than one encoder chunk of it: a batch without is another set of inputs, and one chunk alone a size of
    1, which Dynamo compiles graphs of their own for). The same ``seed``, the same stream (with or without ``audio``:
    its draws are its own)."""
    rng = random.Random(seed)
    long_rng = random.Random(seed + 1)  # (its own draws, apart from the stream's)
    audio_rng = random.Random(seed + 2)

    def sample(long: bool = False) -> list:
        short = rng.randint(2, 6)  # (drawn either way: the rest of the stream is the same with or without long texts)
        items = [Text(long_rng.randint(64, 400) if long else short)]
        for _ in range(rng.randint(0, 3)):
            if videos and rng.random() < 0.2:
                items.append(Video(2 * rng.randint(1, 2), rng.randint(1, 3) * unit, rng.randint(1, 3) * unit))
            else:
                items.append(Image(rng.randint(1, 3) * unit, rng.randint(2, 3) * unit))
            items.append(Text(rng.randint(2, 4)))
        return items

    def with_audio(items: list, first: bool) -> list:
        if audio and (first or audio_rng.random() < 0.5):
            items += [Audio(audio_rng.randint(201 if first else 30, 800)), Text(audio_rng.randint(2, 4))]
        return items

    return [[with_audio(sample(long=row == 0 and long_every > 0 and batch % long_every == 0), row == 0)
             for row in range(rows)] for batch in range(count)]


def stream_batch(config, samples: list, **kwargs) -> dict:
    """``processor_batch(config, samples, **kwargs)`` of a ``stream_layouts`` batch, as far as the family's processor
    takes it: where it refuses images and videos in one batch, the images only; where it needs as many images in
    every sample (GLM-Image's, image-to-image), one each: a sample's first, or the batch's first where it has none (a
    batch without any image stays so: text-to-image). So too for a family whose stream has a graph per image count
    (``PlanHooks.item_sizes``): its stream keeps the count, as an image-editing stream does."""
    layout = layout_of(config.model_type)
    without_videos = [[item for item in sample if not isinstance(item, Video)] for sample in samples]
    if layout is None or not layout.plan.item_sizes:
        for attempt in (samples, without_videos):
            try:
                return processor_batch(config, attempt, **kwargs)
            except InputsNotTaken:
                pass
    samples = without_videos
    first = next((item for sample in samples for item in sample if isinstance(item, Image)), None)
    if first is not None:
        samples = [_one_image(sample, first) for sample in samples]
    return processor_batch(config, samples, **kwargs)


def _one_image(sample: list, default: Image) -> list:
    """``sample`` without its images after the first; with ``default`` after its opening text where it has none."""
    at = next((i for i, item in enumerate(sample) if isinstance(item, Image)), None)
    if at is None:
        return [*sample[:1], default, *sample[1:]]
    return [item for i, item in enumerate(sample) if i <= at or not isinstance(item, Image)]


def audio_stream_layouts(count: int, rows: int = 2, seed: int = 0, long_every: int = 0,
                         text_only_every: int = 5) -> list:
    """``stream_layouts`` for an audio-only family (one clip per sample, as Qwen3-ASR's processor takes them): each of
    ``rows`` samples has text of 2-6 tokens, a clip of 30-800 mel frames (a partial chunk to several attention
    windows; the processor pads a clip shorter than 50) and text of 2-5 tokens; so the batches differ in their clips'
    lengths, the longest (the padded frames), text length and padding. Every ``text_only_every``-th batch (from the
    fourth) has no clip; ``long_every`` as in ``stream_layouts``. The same ``seed``, the same stream."""
    rng = random.Random(seed)
    long_rng = random.Random(seed + 1)

    def sample(long: bool, clip: bool) -> list:
        short = rng.randint(2, 6)
        items = [Text(long_rng.randint(64, 400) if long else short)]
        return items + ([Audio(rng.randint(30, 800)), Text(rng.randint(2, 5))] if clip else [])

    return [[sample(long=row == 0 and long_every > 0 and batch % long_every == 0,
                    clip=not (text_only_every and batch % text_only_every == 3)) for row in range(rows)]
            for batch in range(count)]
