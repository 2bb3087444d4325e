"""Qwen3-Omni-MoE and Qwen2.5-Omni thinkers: an audio encoder and a Qwen-VL vision tower before the text model.

Parity with stock (fp32 on the CPU, bit for bit) over the processors' layouts (audio, images, video,
image + video, a video with its audio track, a text-only row; left and right padding; eager and
SDPA), the audio encoder and the rope index against stock, no syncs with prepare() and one without,
generate and gradients, encoders that compile whole, and bad audio input refused by prepare().
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import check_generate_and_backward_equal_stock, model_pair, traced_copy
from syncfree.audit import assert_no_sync, emulate_cuda
from syncfree.inputs import Audio, Image, Text, Video, VideoWithAudio, build_omni_inputs, omni_forward_kwargs
from syncfree.presets import build_model

pytest.importorskip("transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe")

PRESETS = ("qwen3-omni-tiny", "qwen2.5-omni-tiny")
_pair = model_pair


def _inner(model):
    """The module holding the towers: *ThinkerModel, or the thinker itself in releases without one (5.17)."""
    return model.model if hasattr(model.model, "audio_tower") else model


def _unit(model) -> int:
    return model.config.vision_config.patch_size * 2  # pixels per merged patch side: 32 (Qwen3), 28 (Qwen2.5)


def layouts(u: int) -> dict:
    """Layouts in units of ``u`` pixels; audio in mel frames (100 a second)."""
    return {
        "audio": [[Text(3), Audio(250), Text(2)]],
        "two clips": [[Text(2), Audio(90), Text(1), Audio(317), Text(2)]],
        "images": [[Text(2), Image(2 * u, 3 * u), Text(1), Image(u, u), Text(2)]],
        "video": [[Text(3), Video(4, 2 * u, 2 * u, fps=2.0), Text(2)]],
        "image and video": [[Text(2), Image(2 * u, u), Text(1), Video(2, u, 2 * u), Text(2)]],
        "video with its audio": [[Text(2), VideoWithAudio(Video(4, 2 * u, 2 * u, fps=1.0), Audio(380)), Text(2)]],
        "everything, and a text-only row": [
            [Text(2), Audio(120), Text(1), Image(u, 2 * u), Text(1), Video(2, u, u), Text(2)],
            [Text(4)],
            [Text(1), Audio(210), Text(3)],
        ],
    }


LAYOUT_NAMES = list(layouts(32))


def _batch(model, name: str, padding: str = "left"):
    samples = layouts(_unit(model))[name]
    return build_omni_inputs(model.config, samples, padding_side=padding), omni_forward_kwargs(samples)


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", LAYOUT_NAMES)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", PRESETS)
def test_forward_with_the_audio_flag_equals_stock(name, attn, layout, padding):
    stock, patched = _pair(name, attn)
    batch, flags = _batch(stock, layout, padding)
    with torch.no_grad():
        expected = stock(**batch, **flags).logits
        expected_deltas = _inner(stock).rope_deltas
        assert not expected.isnan().any()
        assert torch.equal(patched(**batch, **flags).logits, expected)
        assert torch.equal(patched(**syncfree.prepare(batch, "cpu", patched), **flags).logits, expected)
        assert torch.equal(_inner(patched).rope_deltas, expected_deltas)


@pytest.mark.parametrize("name", PRESETS)
def test_audio_encoder_output_equals_stock(name):
    stock, patched = _pair(name)
    batch, _ = _batch(stock, "two clips")
    args = (batch["input_features"], batch["feature_attention_mask"])
    with torch.no_grad():
        expected = _inner(stock).get_audio_features(*args).last_hidden_state
        assert torch.equal(_inner(patched).get_audio_features(*args).last_hidden_state, expected)
        # The tower alone, from host lengths (no plan active): planned from them, no device involved.
        frames = batch["input_features"].permute(0, 2, 1)[batch["feature_attention_mask"].bool()].permute(1, 0)
        lengths = batch["feature_attention_mask"].sum(1)
        assert torch.equal(_inner(patched).audio_tower(frames, feature_lens=lengths).last_hidden_state,
                           _inner(stock).audio_tower(frames, feature_lens=lengths).last_hidden_state)


# Random rows of text, images, videos, audio clips and videos with their audio track.
items = st.one_of(st.tuples(st.just("text"), st.integers(1, 4)),
                  st.tuples(st.just("image"), st.integers(1, 3), st.integers(1, 3)),
                  st.tuples(st.just("video"), st.integers(1, 3), st.integers(1, 2)),
                  st.tuples(st.just("audio"), st.integers(1, 320)),
                  st.tuples(st.just("video+audio"), st.integers(1, 3), st.integers(1, 320), st.sampled_from([1.0, 2.0])))


def _item(spec, u: int):
    kind = spec[0]
    if kind == "text":
        return Text(spec[1])
    if kind == "image":
        return Image(u * spec[1], u * spec[2])
    if kind == "video":
        return Video(2 * spec[1], u * spec[2], u)
    if kind == "audio":
        return Audio(spec[1])
    return VideoWithAudio(Video(2 * spec[1], u, u, fps=spec[3]), Audio(spec[2]))


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3),
       padding=st.sampled_from(["left", "right"]), name=st.sampled_from(PRESETS))
def test_planned_rope_index_equals_stock_on_random_layouts(rows, padding, name):
    stock, patched = _pair(name)
    samples = [[_item(spec, _unit(stock)) for spec in row] for row in rows]
    batch = build_omni_inputs(stock.config, samples, padding_side=padding)
    flag = bool(omni_forward_kwargs(samples))
    plan = syncfree.prepare({**batch, "use_audio_in_video": flag}, None, patched)["syncfree_plan"]
    mask = batch.get("feature_attention_mask")
    args = (batch["input_ids"], batch.get("image_grid_thw"), batch.get("video_grid_thw"), batch["attention_mask"], flag,
            mask.sum(1) if mask is not None else None, batch.get("video_second_per_grid"))
    try:
        want = _inner(stock).get_rope_index(*args)
    except Exception as err:  # degenerate layouts (e.g. a clip too short for one audio token) fail in stock
        assert plan.position_ids is None
        with pytest.raises(type(err)):
            _inner(patched).get_rope_index(*args)
        return
    for got, expected in ((plan.position_ids, want[0]), (plan.rope_deltas, want[1])):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    # The patched index called directly (no forward, no plan) gives stock's numbers too.
    assert all(torch.equal(g, w) for g, w in zip(_inner(patched).get_rope_index(*args), want))


# Rows the NumPy index takes (text, images and videos at a few frame rates, with Qwen3-Omni's float time offsets
# whole or not), and a few token edits that break the layout it models.
vision_items = st.one_of(st.tuples(st.just("text"), st.integers(1, 4)),
                         st.tuples(st.just("image"), st.integers(1, 3), st.integers(1, 3)),
                         st.tuples(st.just("video"), st.integers(1, 3), st.integers(1, 2),
                                   st.sampled_from([0.5, 1.0, 2.0, 3.0, 0.7])))
_EDITS = st.one_of(st.just([]), st.lists(st.tuples(
    st.sampled_from(["drop", "insert", "replace"]), st.integers(0, 10**6),
    st.sampled_from(["text", "vision_start", "vision_end", "image", "video", "audio"])), min_size=1, max_size=2))


def _vision_item(spec, u: int):
    if spec[0] == "video":
        return Video(2 * spec[1], u * spec[2], u, fps=spec[3])
    return _item(spec, u)


def _edit_ids(batch: dict, edits, config) -> dict:
    """The first row's kept ids edited (the mask grown or shrunk with them, padding at its side)."""
    ids, mask = batch["input_ids"][0].tolist(), batch["attention_mask"][0].tolist()
    row = [i for i, m in zip(ids, mask) if m]
    token = {"text": 7, "vision_start": config.vision_start_token_id, "vision_end": config.vision_end_token_id,
             "image": config.image_token_id, "video": config.video_token_id, "audio": config.audio_token_id}
    for op, at, what in edits:
        at = at % (len(row) + 1)
        if op == "drop" and at < len(row) and len(row) > 1:
            del row[at]
        elif op == "insert":
            row.insert(at, token[what])
        elif op == "replace" and at < len(row):
            row[at] = token[what]
    width = max(len(row), batch["input_ids"].shape[1])
    left = mask[0] == 0
    out = dict(batch)
    for name, first in (("input_ids", row), ("attention_mask", [1] * len(row))):
        rows = [first] + [batch[name][r].tolist() for r in range(1, batch[name].shape[0])]
        rows = [([0] * (width - len(r)) + r) if left else (r + [0] * (width - len(r))) for r in rows]
        out[name] = torch.tensor(rows, dtype=batch[name].dtype)
    return out


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.lists(vision_items, min_size=1, max_size=4), min_size=1, max_size=3),
       padding=st.sampled_from(["left", "right"]), name=st.sampled_from(PRESETS), edits=_EDITS,
       flag=st.booleans())
def test_the_numpy_index_is_stocks(rows, padding, name, edits, flag):
    """The plan's NumPy index (``families/omni/rope``) against stock's own ``get_rope_index`` run on the same host
    tensors, over random rows of text, images and videos (either padding, text-only rows, frame rates whose time
    offsets are whole or not, either audio flag) and the same with a few ids dropped, inserted or replaced: where it
    answers, every position and delta is stock's, dtype included; where it does not, the plan runs stock's index.
    Rows as the processor writes them, with whole time offsets, it must answer."""
    from syncfree.plan.rope_stock import stock_rope_on_host
    from syncfree.plan.spec import ModelSpec

    config = _pair(name)[0].config
    spec = ModelSpec.from_config(config)
    samples = [[_vision_item(item, _unit(_pair(name)[0])) for item in row] for row in rows]
    batch = build_omni_inputs(config, samples, padding_side=padding)
    if edits:
        batch = _edit_ids(batch, edits, config)
    host = {"input_ids": batch["input_ids"], "image_grid_thw": batch.get("image_grid_thw"),
            "video_grid_thw": batch.get("video_grid_thw"), "video_second_per_grid": batch.get("video_second_per_grid")}
    got = spec.hooks.rope_index(spec, host, batch["attention_mask"], use_audio_in_video=flag)
    whole = all(item[0] != "video" or float(item[3] ** -1 * 2 * config.position_id_per_seconds).is_integer()
                for row in rows for item in row)
    videos = any(item[0] == "video" for row in rows for item in row)
    if not edits and (host["image_grid_thw"] is not None or videos) and (whole or "2.5" in name) \
            and not (flag and videos):
        assert got is not None  # (the processor's layouts: never left to stock's walk)
    if got is None:
        return
    want = stock_rope_on_host(spec.vision_module, spec.rope.audio_class, config, batch["input_ids"],
                              batch["attention_mask"], host["image_grid_thw"], host["video_grid_thw"], flag, None,
                              host["video_second_per_grid"])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


@pytest.mark.parametrize("name, dtype", [("qwen2.5-omni-tiny", torch.float32), ("qwen3-omni-tiny", torch.bfloat16)])
@pytest.mark.parametrize("layout", ["everything, and a text-only row", "video with its audio"])
def test_prepared_prefill_has_no_sync_and_moved_inputs_one(name, dtype, layout):
    # (Qwen3-Omni's experts in bfloat16: the fp32 grouped matmul falls back to a per-expert loop that syncs.)
    stock, patched = _pair(name, dtype=dtype)
    batch, flags = _batch(stock, layout)
    with torch.no_grad():
        expected = stock(**batch, **flags).logits
        with emulate_cuda():
            patched.to("cuda")
            try:
                # The flag in the batch: prepare() makes the positions for it.
                kwargs = syncfree.prepare({**batch, **flags}, "cuda", patched)
                with assert_no_sync():
                    logits = patched(**kwargs).logits
                moved = {k: v.to("cuda") for k, v in batch.items()}
                with assert_no_sync(max_syncs=1):
                    patched(**moved, **flags)
                assert torch.equal(logits.cpu(), expected)
            finally:
                patched.to("cpu")


@pytest.mark.parametrize("name", PRESETS)
def test_generate_and_backward_with_audio_equal_stock(name):
    stock, patched = _pair(name)
    batch, flags = _batch(stock, "everything, and a text-only row")
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, "cpu", patched))
    batch, flags = _batch(stock, "video with its audio")
    with torch.no_grad():
        assert torch.equal(patched.generate(**batch, **flags, **options), stock.generate(**batch, **flags, **options))
    # Beams: generate() repeats every batch tensor row by row; the plan follows (one clip per row here).
    batch = build_omni_inputs(stock.config, [[Text(3), Audio(250), Text(2)], [Text(1), Audio(120), Text(4)]])
    beams = dict(options, num_beams=2, num_return_sequences=2)
    with torch.no_grad():
        assert torch.equal(patched.generate(**syncfree.prepare(batch, "cpu", patched), **beams),
                           stock.generate(**batch, **beams))


@pytest.mark.parametrize("name", PRESETS)
def test_generate_syncs_only_in_the_generation_loop(name):
    _, patched = _pair(name, dtype=torch.bfloat16)
    batch, flags = _batch(patched, "everything, and a text-only row")
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad(), emulate_cuda():
        patched.to("cuda")
        try:
            kwargs = syncfree.prepare(batch, "cuda", patched)
            with syncfree.audit() as report:
                patched.generate(**kwargs, **flags, **options)
        finally:
            patched.to("cpu")
    assert report.syncs and all("transformers/generation/" in e.line for e in report.syncs), report.table()


@pytest.mark.parametrize("name", PRESETS)
def test_patched_encoders_compile_without_graph_breaks(name):
    # Own models: Dynamo keeps weak references to the parameters, after which model.to() cannot swap them.
    stock, patched = build_model(name), syncfree.patch(build_model(name))
    batch, _ = _batch(patched, "everything, and a text-only row")
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
    frames = batch["input_features"].permute(0, 2, 1)[batch["feature_attention_mask"].bool()].permute(1, 0)
    lengths = plan.audio.feature_lens
    explained = torch._dynamo.explain(traced_copy(_inner(patched).audio_tower))(frames, feature_lens=lengths,
                                                                 syncfree_audio_plan=plan.audio)
    assert explained.graph_break_count == 0
    assert torch._dynamo.explain(traced_copy(_inner(stock).audio_tower))(frames, feature_lens=lengths).graph_break_count > 0
    vision = plan.image
    explained = torch._dynamo.explain(traced_copy(_inner(patched).visual))(batch["pixel_values"], grid_thw=vision.grid_thw,
                                                            syncfree_vision_plan=vision)
    assert explained.graph_break_count == 0
    with torch.no_grad():
        compiled = torch.compile(traced_copy(_inner(patched).audio_tower), backend="eager", fullgraph=True)
        assert torch.equal(compiled(frames, feature_lens=lengths, syncfree_audio_plan=plan.audio).last_hidden_state,
                           _inner(stock).audio_tower(frames, feature_lens=lengths).last_hidden_state)


@pytest.mark.parametrize("name", PRESETS)
def test_bad_audio_input_is_refused_by_prepare(name):
    stock, patched = _pair(name)
    batch, _ = _batch(stock, "two clips")
    short = dict(batch, feature_attention_mask=batch["feature_attention_mask"].clone())
    short["feature_attention_mask"][1, 200:] = 0  # the second clip's features no longer fill its placeholders
    with pytest.raises(ValueError, match="Audio features and audio tokens do not match"):
        syncfree.prepare(short, "cpu", patched)
    no_features = {k: v for k, v in batch.items() if k not in ("input_features", "feature_attention_mask")}
    with pytest.raises(ValueError, match="audio placeholders .* no audio features"):
        syncfree.prepare(no_features, "cpu", patched)
    video, flags = _batch(stock, "video with its audio")
    no_track = {k: v for k, v in video.items() if k not in ("input_features", "feature_attention_mask")}
    with pytest.raises(ValueError, match="a video's audio track needs its features"):
        syncfree.prepare(no_track, "cpu", patched)
    with pytest.raises(ValueError, match="input_features given without feature_attention_mask"):
        syncfree.prepare({k: v for k, v in batch.items() if k != "feature_attention_mask"}, "cpu", patched)
    grid = dict(video, video_grid_thw=video["video_grid_thw"] * torch.tensor([[1, 2, 1]]))
    with pytest.raises(ValueError, match="Video features and video tokens do not match"):
        syncfree.prepare(grid, "cpu", patched)
