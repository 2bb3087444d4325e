"""One compiled model for a whole stream of layouts: ``torch.compile(model, fullgraph=True)`` fed batch after batch of
varied layouts from ``syncfree.prepare`` (images of any count and size, videos, text-only rows, padding), with
Dynamo's default automatic dynamic shapes and with ``dynamic=True``, in inference and in a training step; every
fourth batch has a long text (64-400 tokens: past a chunked text model's 64-token chunks, whose count must not make
a graph either).

Each batch's outputs equal the eager patched forward's (``torch.equal``: the ``eager`` and ``aot_eager`` backends run
the graph's own ops, the same kernels); the graphs, counted by a counting backend, do not grow with the stream.
What still makes a graph of its own is the set of inputs a batch passes (images only, with videos, text only): one
graph per input set, none per layout. The other one-graph families (not
``Layout.stream``) compile a graph per layout: tests/test_one_graph.py checks each layout there.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

import syncfree
from family_checks import TINY, unit_of
from syncfree.census.run import discover, patched_type
from syncfree.families import FAMILIES, PRESETS
from syncfree.inputs import (
    Audio,
    Text,
    Video,
    audio_stream_layouts,
    is_audio_only,
    is_omni,
    processor_batch,
    stream_batch,
    stream_layouts,
)
from syncfree.plan.spec import layout_of
from syncfree.presets import build_model

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # (tests/conftest.py)

ONE_GRAPH = [patched_type(f) for f in discover() if patched_type(f) in FAMILIES and patched_type(f) in TINY
             and layout_of(patched_type(f)) is not None and layout_of(patched_type(f)).one_graph]
STREAM = [f for f in ONE_GRAPH if layout_of(f).stream]  # (one graph for any layout: Layout.stream)
_QUICK = {"qwen2_5_vl"}
# (the training stream: every stream family, in the slow step; about a minute each on two CPU cores)
_TRAINING = set(STREAM)
_MOST_GRAPHS = 4  # (what the docs promise for any stream; a graph per input set: images, with videos, text only)


def _stream(model, preset: str, count: int, training: bool = False):
    vocab = model.config.get_text_config().vocab_size
    videos = getattr(model.config, "video_token_id", None) is not None
    # (every fourth batch opens with 64-400 tokens of text: sizes a text model cuts in chunks or windows, which a
    # stream of short texts never crosses; an audio-only family's batches vary their clips instead of images)
    # (an Omni thinker's: clips too, in every batch)
    layouts = audio_stream_layouts(count, long_every=4) if is_audio_only(model.config) else \
        stream_layouts(count, unit_of(model.config), videos=videos, long_every=4, audio=is_omni(model.config))
    for samples in layouts:
        # (as the family's processor takes it: images only, or one image per sample, where it refuses others)
        batch = stream_batch(model.config, samples, pad_token_id=PRESETS[preset].pad_token_id)
        if training:
            batch["labels"] = torch.where(batch["input_ids"] < vocab, batch["input_ids"], -100)
        yield batch


def _model(family: str, training: bool = False):
    preset = TINY[family]
    model = syncfree.patch(build_model(preset))
    model.train(training)
    return model, preset


def _params(quick: set, families: list) -> list:
    """(family, dynamic=None: Dynamo's automatic dynamic shapes), slow but for ``quick``."""
    return [pytest.param(f, None, id=f"{f}-automatic", marks=[] if f in quick else [pytest.mark.slow])
            for f in families]


# (dynamic=True too: Qwen2.5-VL, and the HunYuan towers, whose loops are operators sized by a carrier and the pixels)
# (and GLM-Image, whose per-image loop stays in the graph, over each image's height and width as sizes)
_DYNAMIC = [f for f in ("qwen2_5_vl", "hunyuan_vl", "hy_v4_vl", "glm_image") if f in STREAM]


@pytest.mark.parametrize("family,dynamic", [*_params(_QUICK, STREAM),
                                            *[pytest.param(f, True, id=f"{f}-dynamic", marks=pytest.mark.slow)
                                              for f in _DYNAMIC]])
def test_one_compiled_model_runs_a_stream_of_16_layouts_with_the_eager_logits(family, dynamic):
    model, preset = _model(family)
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend=counter)
    input_sets = set()
    with torch.no_grad():
        for i, batch in enumerate(_stream(model, preset, 16)):
            expected = model(**syncfree.prepare(batch, "cpu", model)).logits
            kwargs = syncfree.prepare(batch, "cpu", model)
            input_sets.add(frozenset(kwargs))
            got = compiled(**kwargs).logits
            assert torch.equal(got, expected), f"batch {i}"
    assert counter.frame_count <= min(_MOST_GRAPHS, len(input_sets))  # (a graph per input set, none per layout)


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in STREAM if f in _TRAINING])
def test_one_compiled_training_step_runs_a_stream_of_16_layouts_with_the_eager_loss_and_gradients(family):
    # (aot_eager: AOTAutograd traces the backward too, the segment operator's included)
    model, preset = _model(family, training=True)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    for i, batch in enumerate(_stream(model, preset, 16, training=True)):
        loss = model(**syncfree.prepare(batch, "cpu", model)).loss
        loss.backward()
        expected = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        got = compiled(**syncfree.prepare(batch, "cpu", model)).loss
        got.backward()
        assert torch.equal(got, loss), f"batch {i}"
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        # (A parameter that reaches the generation cache but not the loss, MiniMax-M3-VL's indexer keys: None eager;
        # zeros compiled, as AOTAutograd differentiates every output the graph returns, the cache's included.)
        cache_only = grads.keys() - expected.keys()
        assert all(not grads[n].any() for n in cache_only), f"batch {i}: {sorted(cache_only)}"
        assert expected.keys() <= grads.keys()
        for name in expected:  # (the graph sums a parameter's contributions in its own order)
            torch.testing.assert_close(grads[name], expected[name], msg=f"batch {i}: {name}")
        model.zero_grad(set_to_none=True)
    assert counter.frame_count <= _MOST_GRAPHS


@pytest.mark.parametrize("family,dynamic", _params(_QUICK | {"minicpmv4_7"}, STREAM))
def test_a_compiled_model_called_alone_compiles_no_graph_for_what_its_first_call_leaves_on_the_model(family, dynamic):
    """Only the compiled model is called (the stream test above runs the eager forward first on every batch): a
    model's first call leaves state on it (stock keeps ``rope_deltas``), which the next batch of the same inputs must
    not compile a graph for (MiniCPM-V 4.7 did: its ``compute_3d_position_ids`` read the rope deltas before the
    cache's length)."""
    model, preset = _model(family)
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    batches = [syncfree.prepare(batch, "cpu", model) for batch in _stream(model, preset, 16)]
    first = next(b for b in batches if len(b) == max(len(b) for b in batches))  # (images, and videos if it takes them)
    same = [b for b in batches if b.keys() == first.keys()][:3]
    with torch.no_grad():
        for batch in same:
            compiled(**batch)
    assert len(same) == 3 and counter.frame_count == 1


def test_the_qwen_vl_core_is_among_the_families_one_graph_serves_a_stream():
    assert {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"} <= set(STREAM)


@pytest.mark.parametrize("in_worker", [False, True])
def test_prepare_marks_its_own_tensors_for_dynamo_never_the_callers(in_worker):
    # (Dynamo reads its marks from the tensor objects: on the caller's grid, a stock model compiled on the same batch
    # afterwards would trace its per-image loop over an unbacked size and fail)
    model, preset = _model("qwen2_5_vl")
    batch = next(_stream(model, preset, 1))
    before = {name: dict(vars(value)) for name, value in batch.items() if isinstance(value, torch.Tensor)}
    syncfree.prepare(syncfree.prepare(batch, None, model) if in_worker else batch, "cpu", model)
    assert {name: dict(vars(value)) for name, value in batch.items() if isinstance(value, torch.Tensor)} == before


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in ("qwen2_5_vl", "qwen3_omni_moe_thinker", "glm5_next", "glm_image")
                                    if f in STREAM])
def test_with_inductor_a_stream_is_within_float32_rounding_of_the_eager_logits(family):
    # (Inductor fuses and reorders the arithmetic: not bitwise, within assert_close's float32 bound; 2.7e-7 seen.
    # Qwen3-Omni: clips in every batch, whose chunks its encoder convolves in groups, which Inductor lowers apart;
    # GLM-5-Next: its indexer's matmul over a number of kept pools the graph holds as a size, which Inductor lowers
    # only knowing it is at least 1; GLM-Image: its VQ quantizer over each image's sides as sizes, which Inductor's
    # CPU matmul lowering cannot take: an operator of its own, codes_op)
    model, preset = _model(family)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        for i, batch in enumerate(_stream(model, preset, 4)):
            expected = model(**syncfree.prepare(batch, "cpu", model)).logits
            torch.testing.assert_close(compiled(**syncfree.prepare(batch, "cpu", model)).logits, expected,
                                       msg=f"batch {i}")


@pytest.mark.parametrize("window", [1, 2, 8])
def test_the_cache_windows_tail_is_stocks_slice_and_one_graph_for_texts_shorter_and_longer(window):
    """``window_tail`` (the sliding-window cache layer's kept keys): stock's ``[:, :, -window + 1:, :]`` in eager and
    in a traced graph, which serves texts shorter and longer than the window alike (stock's slice guards on which)."""
    from syncfree.rewrite.helpers import window_tail

    counter = CompileCounter()
    # (as the next step's update reads the kept keys: concatenated with the new ones)
    compiled = torch.compile(lambda kept, new: torch.cat([window_tail(kept, window), new], dim=2), fullgraph=True,
                             dynamic=True, backend=counter)
    new = torch.ones(2, 6, 13, 4)  # (sizes no kept length shares: Dynamo would take them as one symbol)
    for length in (3, 5, 11, 20, 9):
        states = torch.arange(2 * 6 * length * 4, dtype=torch.float32).reshape(2, 6, length, 4)
        want = states[:, :, -window + 1:, :]
        assert torch.equal(window_tail(states, window), want)
        assert torch.equal(compiled(states, new), torch.cat([want, new], dim=2))
    assert counter.frame_count == 1


@pytest.mark.parametrize("kernel", [3, 4])
def test_a_prefills_convolution_states_are_stocks_and_one_graph_for_texts_shorter_and_longer_than_the_kernel(kernel):
    """``conv_prefill`` (a linear-attention cache layer's prefill): stock's left zero padding up to the kernel in eager
    and in a traced graph, which serves texts shorter and longer than the kernel alike (stock's branch guards on
    which), with the last ``kernel`` tokens the layer keeps."""
    from syncfree.rewrite.helpers import conv_prefill

    def stock(states):
        if states.shape[-1] < kernel:
            states = torch.nn.functional.pad(states, (kernel - states.shape[-1], 0), value=0)
        return states

    counter = CompileCounter()
    compiled = torch.compile(lambda s: (conv_prefill(s, kernel), conv_prefill(s, kernel)[..., -kernel:]),
                             fullgraph=True, dynamic=True, backend=counter)
    # (not 1: Dynamo compiles a size of 1 apart, as every stream does; no length another size shares: duck sizing)
    for length in (2, 7, 4, 12, 5):
        states = torch.arange(3 * 6 * length, dtype=torch.float32).reshape(3, 6, length) + 1
        want = stock(states)
        assert torch.equal(conv_prefill(states, kernel), want)
        full, kept = compiled(states)
        assert torch.equal(full, want) and torch.equal(kept, want[..., -kernel:])
    assert counter.frame_count == 1


def test_the_kept_convolution_tail_is_stocks_and_one_inductor_graph_for_texts_shorter_and_longer_than_the_kernel():
    """``conv_tail`` (the last ``kernel`` tokens a linear-attention cache copies into its state): stock's slice in
    eager; traced, gathered, so that Inductor's copy does not ask whether the slice is contiguous (whether the text was
    at most the kernel, which compiled a graph for each answer: Qwen3.5-MoE's stream with Inductor, 4 graphs for 3
    input sets, before)."""
    from syncfree.rewrite.helpers import conv_prefill, conv_tail

    kernel = 4
    kept = torch.zeros(2, 6, kernel)

    def update(states):
        full = conv_prefill(states, kernel)
        kept.copy_(conv_tail(full, kernel))
        return full

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(update, fullgraph=True, dynamic=True, backend=counter)
    for length in (7, 9, 3, 2, 12):
        states = torch.arange(2 * 6 * length, dtype=torch.float32).reshape(2, 6, length) + 1
        want = torch.nn.functional.pad(states, (max(kernel - length, 0), 0))[..., -kernel:]
        assert torch.equal(conv_tail(conv_prefill(states, kernel), kernel), want)
        compiled(states)
        assert torch.equal(kept, want), length
    assert counter.frame_count == 1


def test_qwen3_omnis_grouped_convolution_is_one_graph_for_one_group_and_the_plans_sizes_past_it():
    """Qwen3-Omni's audio encoder convolves its chunks in groups of ``conv_chunksize``: a traced forward takes the
    chunks' count as a size the graph compares with the group (one graph for any count in one group, one more per
    further group); the logits are the eager forward's either way."""
    if "qwen3_omni_moe_thinker" not in STREAM:
        pytest.skip("this Transformers release has no Qwen3-Omni thinker syncfree traces")
    model, preset = _model("qwen3_omni_moe_thinker")
    encoder = next(m for m in model.modules() if hasattr(m, "conv_chunksize"))  # (5.17's thinker holds it itself)
    model.config.audio_config.conv_chunksize = encoder.conv_chunksize = 3  # (chunks of 100 frames)
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    graphs = []
    with torch.no_grad():
        for frames in (120, 290, 450, 610):  # 2, 3, 5 and 7 chunks: one group twice, then two and three groups
            batch = processor_batch(model.config, [[Text(4), Audio(frames), Text(3)]],
                                    pad_token_id=PRESETS[preset].pad_token_id)
            expected = model(**syncfree.prepare(batch, "cpu", model)).logits
            assert torch.equal(compiled(**syncfree.prepare(batch, "cpu", model)).logits, expected), frames
            graphs.append(counter.frame_count)
    assert graphs == [1, 1, 2, 3]


# (the families whose stock takes no images and videos in one batch: the mixed stream above keeps only their images)
_FRAMES_AS_IMAGES = [f for f in STREAM if layout_of(f).video.frames_as_images]


@pytest.mark.parametrize("family", [pytest.param(f, marks=[] if f == "glm4v" else [pytest.mark.slow])
                                    for f in _FRAMES_AS_IMAGES])
def test_a_stream_of_videos_of_any_frame_count_is_one_graph(family):
    """Video-only batches whose frame counts differ (each frame is an image to the tower: a per-frame grid of as many
    rows as frames) through one compiled model: one graph, with the eager logits."""
    import random

    model, preset = _model(family)
    unit, rng = unit_of(model.config), random.Random(0)
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    frames = set()
    with torch.no_grad():
        for i in range(6):
            samples = [[Text(rng.randint(2, 6)), Video(2 * rng.randint(1, 3), rng.randint(1, 3) * unit,
                                                       rng.randint(1, 2) * unit), Text(2)] for _ in range(2)]
            frames.add(sum(item.frames for sample in samples for item in sample if isinstance(item, Video)))
            batch = processor_batch(model.config, samples, pad_token_id=PRESETS[preset].pad_token_id)
            expected = model(**syncfree.prepare(batch, "cpu", model)).logits
            assert torch.equal(compiled(**syncfree.prepare(batch, "cpu", model)).logits, expected), f"batch {i}"
    assert len(frames) > 2 and counter.frame_count == 1


@pytest.mark.slow
@pytest.mark.skipif("glm5_next" not in STREAM, reason="GLM-5-Next is not registered with this Transformers release")
def test_glm5_nexts_texts_shorter_than_one_pool_share_a_graph_and_longer_ones_another():
    # (its indexer keeps no pool where the longest text is shorter than one (4 tokens in the tiny model): a constant
    # empty prefix, a graph of its own whatever the length; one pool or more, the kept count a size of one other graph)
    model, preset = _model("glm5_next")
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    with torch.no_grad():
        for rows in ((3, 2), (1, 2), (30, 5), (2, 3), (7, 2), (4, 1)):
            batch = processor_batch(model.config, [[Text(n)] for n in rows], pad_token_id=PRESETS[preset].pad_token_id)
            expected = model(**syncfree.prepare(batch, "cpu", model)).logits
            assert torch.equal(compiled(**syncfree.prepare(batch, "cpu", model)).logits, expected), rows
    assert counter.frame_count == 2
