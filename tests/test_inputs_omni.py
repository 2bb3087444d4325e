"""The Omni input builder lays tokens out as the Omni processors do (checked against their own code).

The processors need a tokenizer to run whole; their placeholder logic does not. Their own
``replace_video_with_audio_token`` (the audio-in-video interleaving) and their audio-token count
run here with a stand-in ``self`` holding only what they read, and the builder must agree.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from syncfree.inputs import Audio, Text, Video, VideoWithAudio, audio_tokens, build_omni_inputs
from syncfree.presets import load_config

processing = {
    "qwen3-omni-tiny": pytest.importorskip("transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe"),
    "qwen2.5-omni-tiny": pytest.importorskip("transformers.models.qwen2_5_omni.processing_qwen2_5_omni"),
}
PROCESSORS = {"qwen3-omni-tiny": "Qwen3OmniMoeProcessor", "qwen2.5-omni-tiny": "Qwen2_5OmniProcessor"}
# Releases before 5.2x write the same layout inside one method (replace_multimodal_special_tokens), which
# needs a tokenizer; where the pieces are not separate functions, these checks run on newer releases only.
SEPARATE = {n for n in PROCESSORS if hasattr(getattr(processing[n], PROCESSORS[n]), "replace_video_with_audio_token")
            and hasattr(processing[n], "_get_feat_extract_output_lengths")}
needs_separate = pytest.mark.skipif(len(SEPARATE) < len(PROCESSORS),
                                    reason="this release's Omni processors lay placeholders out in one method")


def _processor_count(name: str, frames: int) -> int:
    module = processing[name]
    if name == "qwen3-omni-tiny":
        return int(module._get_feat_extract_output_lengths(torch.tensor(frames), 50))
    return int(module._get_feat_extract_output_lengths(torch.tensor(frames)))


@needs_separate
@settings(max_examples=60, deadline=None)
@given(frames=st.integers(1, 6000), name=st.sampled_from(sorted(PROCESSORS)))
def test_audio_placeholder_count_is_the_processors(frames, name):
    assert audio_tokens(load_config(name), frames) == _processor_count(name, frames)


def _processor_interleaving(name: str, grid: list[int], seconds: float, n_audio: int, config) -> str:
    cls = getattr(processing[name], PROCESSORS[name])
    fake = types.SimpleNamespace(audio_bos_token="<", audio_eos_token=">", video_token="V", audio_token="A",
                                 video_processor=types.SimpleNamespace(merge_size=2))
    fake.get_chunked_index = types.MethodType(cls.get_chunked_index, fake)
    kwargs = {"position_id_per_seconds": config.position_id_per_seconds, "seconds_per_chunk": 2.0}
    return cls.replace_video_with_audio_token(fake, {"video_grid_thw": [grid], "video_second_per_grid": [seconds]}, 0,
                                              {"num_audio_tokens": np.array([n_audio])}, 0, **kwargs)


@needs_separate
@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(PROCESSORS)), temporal=st.integers(1, 6), side=st.integers(1, 3),
       fps=st.sampled_from([0.5, 1.0, 2.0]), frames=st.integers(100, 1200))
def test_a_videos_audio_track_is_interleaved_as_the_processor_does(name, temporal, side, fps, frames):
    config = load_config(name)
    unit = config.vision_config.patch_size * 2
    video = Video(2 * temporal, side * unit, unit, fps=fps)
    batch = build_omni_inputs(config, [[Text(2), VideoWithAudio(video, Audio(frames)), Text(1)]])
    ids = batch["input_ids"][0].tolist()
    start = ids.index(config.audio_start_token_id)
    run = ids[start + 1:ids.index(config.audio_end_token_id, start)]
    ours = "".join("V" if t == config.video_token_id else "A" for t in run)
    grid = batch["video_grid_thw"][0].tolist()
    theirs = _processor_interleaving(name, grid, float(batch["video_second_per_grid"][0]), audio_tokens(config, frames),
                                     config)
    assert theirs == "<" + ours + ">"
    assert ids[start - 1] == config.vision_start_token_id  # <|vision_start|><|audio_start|> ... as the chat template
