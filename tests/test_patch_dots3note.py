"""dots3-note: a Qwen-style packed tower with MoE blocks and its merger inside, an audio encoder on packed chunks, and a
MoE text model with latent attention sized per layer, without 3D positions. The processor's layout (audio chunks),
parity with stock over images, videos and audio (left and right padding, eager and SDPA), no syncs and no blocking
copies with prepare() in bf16 (fp32's MoE experts keep their remainder), generate (dynamic, static, beams over audio
chunks without a read), gradients, the tower under compile, the planned chunk expansion against stock's on random
layouts, and the census's tiny model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_forward_equals_stock,
    check_generate_and_backward_equal_stock,
    check_generate_modes_equal_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    prepared_generate_audited,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.audit import audit, emulate_cuda
from syncfree.families.shared import family_module, installed_source_has
from syncfree.inputs import Image, Text, Video, Waveform, processor_batch

# (Skipped only where Transformers has no such code: where it has, these fail unless syncfree supports the family.)
pytestmark = pytest.mark.skipif(
    not installed_source_has(family_module("dots3_note"), "chunk_sample_lengths", "mm_encoder_outputs"),
    reason="this Transformers release has no dots3-note with packed audio chunks")
NAME = "dots3-note-tiny"


def _build(config, samples, padding_side="left"):
    from syncfree.families.dots3 import build_dots3_inputs

    return build_dots3_inputs(config, samples, padding_side=padding_side)


# Pixels are multiples of 28 (patch 14 x merge 2). The tiny audio encoder takes 32 samples per placeholder and its
# feature extractor cuts 960-sample chunks: a 1000-sample clip is a full chunk (30 placeholders) and one of 40 samples
# (2), so the chunks of a batch have different valid lengths; one full chunk alone has no padded frame.
LAYOUTS = {
    **standard_layouts(28),
    "image and audio": [[Text(2), Image(56, 84), Text(1), Waveform(100), Text(2)]],
    "audio chunks, a video and a text-only row": [[Text(1), Waveform(1000), Video(2, 56, 56), Text(1)],
                                                  [Text(2), Waveform(37), Image(28, 28), Waveform(960), Text(1)],
                                                  [Text(3)]],
    "one full audio chunk": [[Text(2), Waveform(960), Text(1)]],
}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


def test_the_processor_layout():
    """Placeholders without markers or token types; each clip cut into chunks, packed over the batch in order."""
    config = model_pair(NAME)[0].config
    batch = _build(config, [[Text(1), Image(56, 28), Waveform(1000), Text(1)], [Video(2, 28, 56), Waveform(33)]])
    assert "mm_token_type_ids" not in batch
    ids = batch["input_ids"]
    assert (ids == config.image_token_id).sum() == 2 and (ids == config.video_token_id).sum() == 2 * 2
    assert (ids[0] == config.audio_token_id).sum() == 30 + 2 and (ids[1] == config.audio_token_id).sum() == 2
    assert batch["chunk_sample_lengths"].tolist() == [960, 40, 33]
    assert batch["input_features"].shape == (3, config.audio_config.feature_size, 8 * 30)
    assert batch["pixel_values"].shape == (2 * 4, 3 * 14 * 14) and batch["image_grid_thw"].tolist() == [[1, 4, 2]]
    assert batch["video_grid_thw"].tolist() == [[2, 2, 4]]  # (one row per frame's patches: t = frames)


def test_the_tiny_model_sizes_its_layers_apart():
    """The preset keeps the real model's per-layer config: its sliding layer has its own heads and latent rank, and the
    tower's second block is a MoE."""
    model = model_pair(NAME)[0]
    indexed, sliding = (model.model.language_model.layers[i].self_attn for i in (0, 1))
    assert (indexed.num_heads, sliding.num_heads, indexed.kv_lora_rank, sliding.kv_lora_rank) == (4, 2, 32, 16)
    assert indexed.indexer is not None and sliding.indexer is None
    assert type(model.model.vision_tower.blocks[1].mlp).__name__ == "Dots3NoteVisionMoE"


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_equals_stock_on_its_own_layouts(attn, layout, padding):
    stock, patched = model_pair(NAME, attn)
    check_forward_equals_stock(stock, patched, _build(stock.config, LAYOUTS[layout], padding))


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(clips=st.lists(st.lists(st.integers(1, 2000), min_size=0, max_size=2), min_size=1, max_size=3))
def test_any_audio_chunks_equal_stock(clips):
    """Clips of any length (several chunks, chunks that fill every frame or few) in any rows: stock's logits."""
    stock, patched = model_pair(NAME)
    batch = _build(stock.config, [[Text(2), *(Waveform(n) for n in row), Text(1)] for row in clips])
    check_forward_equals_stock(stock, patched, batch)


def _bf16(batch: dict) -> dict:
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}


@pytest.mark.parametrize("layout", ["audio chunks, a video and a text-only row", "one full audio chunk",
                                    "image and videos"])
def test_prepared_prefill_has_no_sync_and_no_blocking_copy(layout):
    """In bf16, where the MoE experts of the tower and of the text model take the grouped path."""
    stock, patched = model_pair(NAME, "sdpa", torch.bfloat16)
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, _bf16(_build(stock.config, LAYOUTS[layout])))


def test_fp32_prepared_prefill_leaves_only_the_moe_remainder():
    """In fp32 the experts' grouped matmul falls back to a loop that reads the routing: two reads per MoE call (the
    tower's MoE block for the images and for the videos, the text model's two MoE layers), nothing else."""
    stock, patched = model_pair(NAME)
    batch = _build(stock.config, LAYOUTS["audio chunks, a video and a text-only row"])
    with torch.no_grad():
        expected = stock(**batch).logits
        with emulate_cuda():
            patched.to("cuda")
            try:
                with audit() as prepared:
                    logits = patched(**syncfree.prepare(batch, "cuda", patched)).logits
                logits = logits.cpu()  # (after the audit: reading the result is not the forward's doing)
            finally:
                patched.to("cpu")
    assert torch.equal(logits, expected)
    assert len(prepared.syncs) == 2 * 4 and all("integrations/moe.py" in str(e.where) for e in prepared.syncs)
    assert not prepared.blocking_copies


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["audio"])  # (images and videos: the conformance suite)
def test_generate_and_backward_with_audio_chunks_equal_stock(layout):
    stock, patched = model_pair(NAME)
    samples = {
        "images": [[Text(2), Image(112, 56), Text(2), Image(56, 56), Text(1)], [Text(1), Image(56, 56), Text(2)]],
        "videos": [[Text(2), Video(4, 56, 56), Text(1)], [Text(1), Video(2, 56, 84), Text(2)]],
        "audio": [[Text(2), Waveform(1000), Image(56, 28), Text(1)], [Text(1), Waveform(70), Text(2)]],
    }[layout]
    batch = _build(stock.config, samples)
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    check_generate_modes_equal_stock(stock, patched, batch, options)


def test_beams_over_audio_chunks_read_nothing_in_the_model():
    """generate() with beams repeats each sample's group of packed audio chunks: grouped on the plan's host copies, and
    the prefill of the expanded batch planned, so no line of the model's code (nor the mask code) reads the device;
    what is left is generate()'s own (its stopping and beam bookkeeping), as in every family."""
    stock, patched = model_pair(NAME, "sdpa", torch.bfloat16)
    batch = _bf16(_build(stock.config, LAYOUTS["audio chunks, a video and a text-only row"][:2]))
    options = dict(max_new_tokens=2, do_sample=False, pad_token_id=0, eos_token_id=None, num_beams=2,
                   num_return_sequences=2)
    ids, expected, report = prepared_generate_audited(stock, patched, batch, options)
    assert torch.equal(ids, expected)
    assert not [str(e.where) for e in report.syncs if "dots3_note" in str(e.where) or "masking_utils" in str(e.where)]


def test_the_patched_tower_compiles_without_a_graph_break():
    """With the plan's tables handed over, the tower (its MoE block included) reads nothing of its grid: one graph."""
    _, patched = model_pair(NAME)
    batch = processor_batch(patched.config, [[Image(112, 84), Image(56, 28)]])
    explained = tower_graph_breaks(patched, patched.model.vision_tower, batch)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]


def test_a_placeholder_count_that_does_not_match_fails_as_stock():
    """One audio placeholder too few: the patched forward's check (from the plan's count) raises stock's error."""
    stock, patched = model_pair(NAME)
    batch = _build(stock.config, [[Text(2), Waveform(100), Text(2)]])
    ids = batch["input_ids"]
    ids[ids == stock.config.audio_token_id] = torch.tensor([stock.config.audio_token_id] * 3 + [5])
    errors = []
    for model, inputs in ((stock, batch), (patched, syncfree.prepare(batch, None, patched))):
        with pytest.raises(Exception) as caught, torch.no_grad():
            model(**inputs)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1] and "tokens: 3, features: 4" in errors[0][1]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.integers(1, 200), min_size=0, max_size=3), min_size=1, max_size=4),
       k=st.integers(2, 3), drop=st.booleans())
def test_the_planned_chunk_expansion_is_stocks(rows, k, drop):
    """The plan's expansion of the packed chunks for ``k`` copies of each row (host integers) is what stock's
    _expand_inputs_for_generation makes of them; where stock refuses the layout (a placeholder dropped), the plan
    makes none (the forward then runs stock's own selection)."""
    from syncfree.families.dots3.plan import expanded_chunk_lengths

    config = model_pair(NAME)[0].config
    stride, audio = config.audio_config.samples_per_token, config.audio_token_id
    lengths = [n for row in rows for n in row]
    tokens = [sum(-(-n // stride) for n in row) for row in rows]
    width = max(tokens) + 1
    input_ids = torch.ones(len(rows), width, dtype=torch.long)
    for r, n in enumerate(tokens):
        input_ids[r, :n] = audio
    if drop and sum(tokens):
        input_ids[input_ids.eq(audio).any(-1).nonzero()[0, 0], 0] = 1
    chunk_sample_lengths = torch.tensor(lengths, dtype=torch.long)
    ours = expanded_chunk_lengths(chunk_sample_lengths, input_ids, audio, stride, k) if lengths else None
    if not lengths:
        return
    features = torch.arange(len(lengths), dtype=torch.float).view(-1, 1, 1)
    try:
        _, stocks = model_pair(NAME)[0]._expand_inputs_for_generation(
            expand_size=k, input_ids=input_ids, input_features=features, chunk_sample_lengths=chunk_sample_lengths)
    except ValueError:
        assert ours is None
        return
    assert ours is not None and torch.equal(ours, stocks["chunk_sample_lengths"])


@pytest.mark.slow
def test_the_census_builds_and_runs_it():
    """The census's tiny model of the default config (its per-layer attention shrunk alike): built, fully supported,
    stock's outputs; in fp32 only the MoE experts' grouped-matmul fallback is left with prepare()."""
    from syncfree.census.run import census_family

    row = census_family("dots3_note", graph_breaks=False)
    assert (row.status, row.support, row.same_outputs) == ("ok", "full", True), row.reason
    assert row.prepared_syncs < row.patched_syncs < row.stock_syncs and "moe.py" in row.left
