"""Omni thinker inputs (Qwen3-Omni-MoE, Qwen2.5-Omni) laid out as their processors lay them out, without a tokenizer.

Besides images and videos (``Image``/``Video``: start token, one pad per merged patch,
end token; a video is one run, no timestamps) the Omni processors take audio. Each audio clip becomes
``<|audio_start|>`` + one ``<|audio_pad|>`` per encoder output frame + ``<|audio_end|>``; its mel
features (128 bins, 100 frames a second) are padded to the longest clip, with a
``feature_attention_mask`` marking the real frames, as the Whisper feature extractor returns them.

With the audio track of a video (``VideoWithAudio``, the processor's ``load_audio_from_video``), the
video's pads and its audio's pads share one run between ``<|vision_start|><|audio_start|>`` and
``<|audio_end|><|vision_end|>``, interleaved by time: Qwen3-Omni puts a video pad first when its time
position is not later than the audio pad's; Qwen2.5-Omni alternates chunks of ``seconds_per_chunk``.
Clips are listed in order of appearance (the features of a video's audio included), as the model
consumes them. The forward then needs ``use_audio_in_video=True`` (``omni_forward_kwargs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...items import Audio, Draft, Image, Row, Text, Video, batch_builder, item_grid, pixel_inputs

__all__ = ["VideoWithAudio", "build_omni_inputs", "audio_tokens", "OMNI_LAYOUT_NAMES", "omni_layout",
           "omni_forward_kwargs", "END_TOKENS", "is_omni"]


def is_omni(config) -> bool:
    """True for an Omni thinker's config, or its model type (audio placeholders, ``build_omni_inputs``)."""
    model_type = config if isinstance(config, str) else getattr(config, "model_type", "")
    return model_type in END_TOKENS

# The end tokens the tokenizers use (not in the thinker configs, which name only what the model reads).
END_TOKENS = {"qwen3_omni_moe_thinker": dict(vision_end_token_id=151653, audio_end_token_id=151670),
              "qwen2_5_omni_thinker": dict(vision_end_token_id=151653, audio_end_token_id=151648)}


@dataclass(frozen=True)
class VideoWithAudio:
    video: Video
    audio: Audio


# The items an Omni processor takes.
OMNI_ITEMS = (Text, Image, Video, Audio, VideoWithAudio)


def audio_tokens(config, frames: int) -> int:
    """Pads the processor gives a clip of ``frames`` mel frames (what the audio encoder outputs for it)."""
    if config.model_type == "qwen3_omni_moe_thinker":
        chunk = config.audio_config.n_window * 2
        rest = (frames % chunk - 1) // 2 + 1
        return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13
    after_conv = (frames - 1) // 2 + 1  # Qwen2.5-Omni: one stride-2 convolution, then a stride-2 pooling
    return (after_conv - 2) // 2 + 1


def _chunks(times: list[float], per_chunk: int) -> list[tuple[int, int]]:
    # (start, end) slices of a non-decreasing list of times, one per per_chunk-wide window of time.
    out, start, k = [], 0, 1
    for i, value in enumerate(times):
        if value >= k * per_chunk:
            out.append((start, i))
            start, k = i, k + 1
    out.append((start, len(times)))
    return out


def _interleave(config, video_times: list[float], n_audio: int) -> list[str]:
    audio_times = list(range(n_audio))
    if config.model_type == "qwen3_omni_moe_thinker":
        order, v, a = [], 0, 0
        while v < len(video_times) and a < n_audio:
            if video_times[v] <= audio_times[a]:
                order.append("v")
                v += 1
            else:
                order.append("a")
                a += 1
        return order + ["v"] * (len(video_times) - v) + ["a"] * (n_audio - a)
    per_chunk = int(config.position_id_per_seconds * config.seconds_per_chunk)
    vc, ac = _chunks(video_times, per_chunk), _chunks(audio_times, per_chunk)
    order = []
    for j in range(max(len(vc), len(ac))):
        if j < len(vc):
            order += ["v"] * (vc[j][1] - vc[j][0])
        if j < len(ac):
            order += ["a"] * (ac[j][1] - ac[j][0])
    return order


@batch_builder(OMNI_ITEMS, default_pad=0)
def build_omni_inputs(batch: Draft, *, mel_bins: int | None = None) -> dict[str, torch.Tensor]:
    """Processor-style inputs for an Omni thinker ``config``: one list of items per request."""
    config = batch.config
    vc, tc = config.vision_config, config.text_config
    patch, merge, tpatch = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
    ends = {k: getattr(config, k, None) or v for k, v in END_TOKENS[config.model_type].items()}
    ids_of = dict(image=config.image_token_id, video=config.video_token_id, audio=config.audio_token_id,
                  vs=config.vision_start_token_id, ve=ends["vision_end_token_id"],
                  as_=config.audio_start_token_id, ae=ends["audio_end_token_id"])
    specials = set(ids_of.values()) | {batch.pad}
    image_grids, video_grids, seconds, clips = [], [], [], []

    def place(row: Row, item: Image | Video | Audio | VideoWithAudio) -> None:
        if isinstance(item, Audio):
            clips.append(item.frames)
            row.add([ids_of["as_"]] + [ids_of["audio"]] * audio_tokens(config, item.frames) + [ids_of["ae"]])
        elif isinstance(item, Image):
            t, h, w = item_grid(item, patch, merge, tpatch)
            image_grids.append((t, h, w))
            row.add([ids_of["vs"]] + [ids_of["image"]] * (h * w // merge**2) + [ids_of["ve"]])
        else:  # (a Video or a VideoWithAudio: check_items refused anything else)
            video = item.video if isinstance(item, VideoWithAudio) else item
            t, h, w = item_grid(video, patch, merge, tpatch)
            video_grids.append((t, h, w))
            seconds.append(tpatch / video.fps)
            per_frame = h * w // merge**2
            if isinstance(item, Video):
                row.add([ids_of["vs"]] + [ids_of["video"]] * (t * per_frame) + [ids_of["ve"]])
                return
            clips.append(item.audio.frames)
            times = [f * seconds[-1] * config.position_id_per_seconds for f in range(t) for _ in range(per_frame)]
            order = _interleave(config, times, audio_tokens(config, item.audio.frames))
            row.add([ids_of["vs"], ids_of["as_"]] + [ids_of["video"] if o == "v" else ids_of["audio"] for o in order])
            row.add([ids_of["ae"], ids_of["ve"]])

    rows = batch.rows(place, avoid=specials, high=min([i for i in specials if i > 0] + [tc.vocab_size]))
    out = batch.packed(rows, typed=False)  # (the processor returns no token types)
    out.update(pixel_inputs(vc, image_grids, video_grids, batch.gen))
    if video_grids:
        out["video_second_per_grid"] = torch.tensor(seconds)
    if clips:
        bins = mel_bins or config.audio_config.num_mel_bins
        longest = max(clips)
        mask = torch.zeros(len(clips), longest, dtype=torch.int32)  # the feature extractor's int32 mask
        for i, n in enumerate(clips):
            mask[i, :n] = 1
        out["input_features"] = torch.randn(len(clips), bins, longest, generator=batch.gen) * mask[:, None, :]
        out["feature_attention_mask"] = mask
    return out


def omni_forward_kwargs(samples: list[list]) -> dict:
    """The forward's flags for these samples: ``use_audio_in_video`` when a video carries its audio."""
    with_audio = any(isinstance(item, VideoWithAudio) for sample in samples for item in sample)
    return {"use_audio_in_video": True} if with_audio else {}


OMNI_LAYOUT_NAMES = ("audio", "image", "images", "video", "mixed", "audio-in-video")


def omni_layout(name: str, side: int = 64, unit: int = 32, seconds: float = 3.0) -> list[list]:
    """Named Omni layouts: ``side`` pixels per image side, ``seconds`` of audio per clip."""
    side = max(side // unit * unit, unit)
    frames = max(int(seconds * 100), 1)
    if name == "audio":
        return [[Text(10), Audio(frames), Text(12)]]
    if name == "image":
        return [[Text(10), Image(side, side), Text(12)]]
    if name == "images":
        half = max(side // 2 // unit * unit, unit)
        return [[Text(10), Image(side, side), Text(3), Image(half, side), Text(3), Image(side, half), Text(12)]]
    if name == "video":
        return [[Text(10), Video(4, side, side), Text(12)]]
    if name == "mixed":
        return [[Text(6), Audio(frames), Text(3), Image(side, side), Text(3), Video(4, side, side), Text(8)],
                [Text(5), Audio(frames // 2 + 17), Text(9)]]
    if name == "audio-in-video":
        return [[Text(6), VideoWithAudio(Video(4, side, side, fps=1.0), Audio(frames)), Text(8)]]
    raise ValueError(f"unknown Omni input kind {name!r}; choose one of {', '.join(OMNI_LAYOUT_NAMES)}")
