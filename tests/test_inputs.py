"""Inputs are laid out as the Qwen3-VL processor lays them out (property-based)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from family_checks import shipped_types
from syncfree.families import tiny_preset
from syncfree.inputs import Image, Text, Video, build_inputs, named_layout, stream_layouts
from syncfree.presets import load_config

CONFIG = load_config("qwen3-vl-tiny")
side = st.integers(1, 4).map(lambda k: 32 * k)
media = st.one_of(
    st.builds(Image, side, side),
    st.builds(Video, st.integers(1, 3).map(lambda k: 2 * k), side, side, st.sampled_from([1.0, 2.0, 24.0])),
)
sample = st.lists(st.one_of(media, st.builds(Text, st.integers(1, 5))), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(samples=st.lists(sample, min_size=1, max_size=3), padding=st.sampled_from(["left", "right"]))
def test_layout_matches_the_processor(samples, padding):
    batch = build_inputs(CONFIG, samples, padding_side=padding)
    ids, types, mask = batch["input_ids"], batch["mm_token_type_ids"], batch["attention_mask"]
    # Token types mark exactly the image pads (1) and the video pads (2).
    assert torch.equal(types == 1, ids == CONFIG.image_token_id)
    assert torch.equal(types == 2, ids == CONFIG.video_token_id)
    images = [m for s in samples for m in s if isinstance(m, Image)]
    videos = [m for s in samples for m in s if isinstance(m, Video)]
    # One placeholder per merged patch, grids listed in order of appearance.
    expected_images = [(1, m.height // 16, m.width // 16) for m in images]
    expected_videos = [(m.frames // 2, m.height // 16, m.width // 16) for m in videos]
    assert batch.get("image_grid_thw", torch.empty(0, 3)).tolist() == [list(g) for g in expected_images]
    assert batch.get("video_grid_thw", torch.empty(0, 3)).tolist() == [list(g) for g in expected_videos]
    assert int((ids == CONFIG.image_token_id).sum()) == sum(t * h * w // 4 for t, h, w in expected_images)
    assert int((ids == CONFIG.video_token_id).sum()) == sum(t * h * w // 4 for t, h, w in expected_videos)
    # Each image, and each temporal patch of a video, sits between its own start and end tokens.
    n_segments = len(images) + sum(t for t, _, _ in expected_videos)
    assert int((ids == CONFIG.vision_start_token_id).sum()) == n_segments
    assert int((ids == CONFIG.vision_end_token_id).sum()) == n_segments
    # Padding sits on the chosen side and is text.
    for row in mask:
        real = row.nonzero().flatten()
        assert real.numel() == int(row.sum())
        edge = row.numel() - 1 if padding == "left" else 0
        assert int(real.max() if padding == "left" else real.min()) == edge
    assert bool((types[mask == 0] == 0).all())
    if "pixel_values" in batch:
        assert batch["pixel_values"].shape == (sum(t * h * w for t, h, w in expected_images), 3 * 2 * 16 * 16)


def test_video_frames_are_separated_by_timestamp_text():
    batch = build_inputs(CONFIG, [[Video(6, 32, 32)]])
    ids = batch["input_ids"][0].tolist()
    starts = [i for i, t in enumerate(ids) if t == CONFIG.vision_start_token_id]
    ends = [i for i, t in enumerate(ids) if t == CONFIG.vision_end_token_id]
    assert len(starts) == 3
    # Text (the timestamp) comes before every frame, including between one frame's end and the next start.
    assert starts[0] > 0 and all(s - e > 1 for e, s in zip(ends, starts[1:]))


@pytest.mark.parametrize("bad", [Image(48, 64), Image(0, 32), Video(3, 32, 32)])
def test_sizes_the_processor_cannot_produce_are_refused(bad):
    with pytest.raises(ValueError, match="multiples? of"):
        build_inputs(CONFIG, [[bad]])


def test_named_layouts_cover_the_cli_kinds():
    assert {k: len(named_layout(k, 64)) for k in ("image", "images", "video", "mixed")} == {
        "image": 1, "images": 1, "video": 1, "mixed": 2}
    with pytest.raises(ValueError, match="unknown input kind"):
        named_layout("audio")


@pytest.mark.parametrize("preset", [pytest.param(tiny_preset(t), id=t) for t in shipped_types()])
def test_processor_batch_refuses_an_item_its_processor_does_not_take_in_one_line(preset):
    """An item of another modality, a bare string, or a sample that is not a list: a one-line error naming the model
    type and the item, never a traceback from deep in the builder."""
    from syncfree.inputs import Audio, Waveform, processor_batch
    from syncfree.plan.errors import InputsNotTaken

    config = load_config(preset)
    foreign = [item for item in (Audio(250), Waveform(16000), "a prompt") if not _takes(config, item)]
    for item in foreign:
        with pytest.raises(InputsNotTaken, match=rf"^{config.model_type} takes .* items, got {re.escape(repr(item))}$"):
            processor_batch(config, [[Text(2), item, Text(1)]])
    with pytest.raises(TypeError, match=r"^samples must be a list of samples, each a list of items"):
        processor_batch(config, [Text(2), Text(1)])


def _takes(config, item) -> bool:
    from syncfree.families import GROUPS

    group = next(g for g in reversed(GROUPS) if g.handles(config))
    return isinstance(item, group.items)


def test_build_inputs_refuses_an_item_it_does_not_take_in_one_line():
    from syncfree.inputs import Audio
    from syncfree.plan.errors import InputsNotTaken

    config = load_config("qwen3-vl-tiny")
    with pytest.raises(InputsNotTaken, match=r"^qwen3_vl takes Text, Image and Video items, got Audio\(frames=250\)$"):
        build_inputs(config, [[Text(2), Audio(250)]])


@given(seed=st.integers(0, 10_000), long_every=st.integers(1, 5))
@settings(max_examples=40, deadline=None)
def test_a_streams_long_texts_replace_only_the_first_text_of_every_nth_batch(seed, long_every):
    short = stream_layouts(12, 16, seed=seed)
    mixed = stream_layouts(12, 16, seed=seed, long_every=long_every)
    for batch, (plain, varied) in enumerate(zip(short, mixed)):
        for row, (a, b) in enumerate(zip(plain, varied)):
            assert a[1:] == b[1:]  # (everything after the first text: the same stream)
            if row == 0 and batch % long_every == 0:
                assert 64 <= b[0].tokens <= 400
            else:
                assert a[0] == b[0]
