"""Qwen3-ASR: an audio-only model (a windowed audio encoder before a Qwen3 text model; no image token, no rotary index of
its own). The plan's windows and valid frames against stock's encoder on random clip lengths, parity with stock over the
processor's layouts, no syncs and no blocking copies with prepare(), generate (dynamic, static and beams), gradients,
the encoder under torch.compile."""

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
    traced_copy,
)
from syncfree.audit import assert_no_sync, emulate_cuda
from syncfree.families.shared import installed_source_has
from syncfree.inputs import Audio, Text, processor_batch
from syncfree.presets import build_model

# (Skipped only where Transformers ships no such encoder: where it does, the family must be registered.)
pytestmark = pytest.mark.skipif(not installed_source_has("transformers.models.qwen3_asr.modeling_qwen3_asr",
                                                         "def get_audio_cu_seqlens("),
                                reason="this Transformers release has no Qwen3-ASR encoder of this code")
NAME = "qwen3-asr-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


def _build(config, samples, padding_side="left"):
    from syncfree.families.qwen3asr import build_asr_inputs

    return build_asr_inputs(config, samples, padding_side=padding_side)


# One clip per row, as the processor takes them; mel frames: 100-frame chunks (13 tokens each after the convolutions),
# attention windows of two chunks (26 frames), so the longer clips have several windows and a partial chunk.
LAYOUTS = {
    "one clip": [[Text(4), Audio(250), Text(3)]],
    "clips of different lengths": [[Text(3), Audio(517), Text(2)], [Text(5), Audio(130), Text(4)],
                                   [Text(2), Audio(60), Text(6)]],
    "whole chunks and a short clip": [[Text(1), Audio(400), Text(1)], [Text(6), Audio(55), Text(2)]],
}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = ["whole chunks and a short clip"]


def test_the_processor_layout():
    """Markers around each clip's placeholders; features right-padded to whole chunks with their frame mask."""
    from syncfree.families.qwen3asr import MARKERS, audio_tokens

    config = _pair()[0].config
    batch = _build(config, LAYOUTS["clips of different lengths"])
    assert set(batch) == {"input_ids", "attention_mask", "input_features", "input_features_mask"}
    assert batch["input_features"].shape == (3, 16, 600) and batch["input_features_mask"].dtype == torch.int32
    assert batch["input_features_mask"].sum(-1).tolist() == [517, 130, 60]
    ids = batch["input_ids"][0].tolist()
    start = ids.index(MARKERS["audio_start"])
    n = audio_tokens(config, 517)
    assert n == 5 * 13 + 3 and ids[start + 1:start + n + 2] == [config.audio_token_id] * n + [MARKERS["audio_end"]]
    assert batch["attention_mask"][:, 0].tolist() == [1, 0, 0]  # (left padding, the processor's: the longest row first)


@settings(max_examples=25, deadline=None)
@given(frames=st.lists(st.integers(50, 900), min_size=1, max_size=4), extra=st.integers(0, 2))
def test_the_planned_encoder_equals_stock_on_random_clips(frames, extra):
    """The patched encoder (its windows and valid frames planned on a host copy of the mask) gives stock's outputs,
    for any clip lengths and any whole chunks of padding beyond the longest."""
    stock, patched = _pair()
    chunk = 100
    width = (-(-max(frames) // chunk) + extra) * chunk
    mask = torch.zeros(len(frames), width, dtype=torch.int32)
    for i, n in enumerate(frames):
        mask[i, :n] = 1
    features = torch.randn(len(frames), 16, width, generator=torch.Generator().manual_seed(sum(frames)))
    with torch.no_grad():
        want = stock.model.audio_tower(features, mask).last_hidden_state
        got = patched.model.audio_tower(features, mask).last_hidden_state
    assert torch.equal(got, want)


def test_the_plan_is_stocks_layout():
    """The plan's windows and valid frames are what stock's encoder derives from the same mask."""
    import transformers.models.qwen3_asr.modeling_qwen3_asr as stock_module

    stock, patched = _pair()
    batch = _build(stock.config, LAYOUTS["clips of different lengths"])
    audio = syncfree.prepare(batch, None, patched)["syncfree_plan"].audio
    mask = batch["input_features_mask"]
    chunk_lengths = mask.view(3, 6, 100).sum(-1).reshape(-1).long()
    want = stock_module.get_audio_cu_seqlens(chunk_lengths, mask.sum(-1).long(), 200, 50)
    assert torch.equal(audio.cu_seqlens, want) and audio.seqlens == tuple((want[1:] - want[:-1]).tolist())
    assert audio.n_outputs == int((batch["input_ids"] == stock.config.audio_token_id).sum()) == sum(audio.seqlens)
    assert len(audio.seqlens) > 3 and int(audio.max_seqlen) == max(audio.seqlens) == 26


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_equals_stock_on_its_own_layouts(attn, layout, padding):
    stock, patched = _pair(attn)
    check_forward_equals_stock(stock, patched, _build(stock.config, LAYOUTS[layout], padding))


def test_the_encoders_attention_weights_equal_stock():
    """Every encoder layer splits by the plan's window sizes: each layer's per-window weights are stock's."""
    stock, patched = _pair("eager")
    batch = _build(stock.config, LAYOUTS["clips of different lengths"])
    with torch.no_grad():
        want = stock.model.get_audio_features(batch["input_features"], batch["input_features_mask"],
                                              output_attentions=True)
        got = patched.model.get_audio_features(batch["input_features"], batch["input_features_mask"],
                                               output_attentions=True)
    assert torch.equal(got.pooler_output, want.pooler_output)
    assert len(got.attentions) == len(want.attentions) == 2
    for g, w in zip(got.attentions, want.attentions):
        assert torch.equal(g, w)


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["clips of different lengths"])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


def test_the_encoder_patches_alone():
    """syncfree.patch() takes the audio encoder alone (it has no vision tower): stock's outputs, one read of the mask."""
    stock, _ = _pair()
    encoder = syncfree.patch(build_model(NAME).model.audio_tower)
    assert syncfree.is_patched(encoder)
    batch = _build(stock.config, LAYOUTS["clips of different lengths"])
    with torch.no_grad():
        want = stock.model.audio_tower(batch["input_features"], batch["input_features_mask"]).last_hidden_state
        with emulate_cuda():
            encoder.to("cuda")
            try:
                features, mask = batch["input_features"].to("cuda"), batch["input_features_mask"].to("cuda")
                with assert_no_sync(max_syncs=1):
                    got = encoder(features, mask)
                got = got.last_hidden_state.cpu()
            finally:
                encoder.to("cpu")
    assert torch.equal(got, want)


def test_a_placeholder_mismatch_is_stocks_error():
    """A batch whose placeholders do not number the encoder's frames: stock's own error, from the patched model too."""
    stock, patched = _pair()
    batch = _build(stock.config, LAYOUTS["one clip"])
    batch["input_ids"][0, -1] = stock.config.audio_token_id
    for model in (stock, patched):
        with pytest.raises(ValueError, match="Audio features and audio tokens do not match"), torch.no_grad():
            model(**batch)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_generate_and_backward_equal_stock_with_either_padding(padding):
    stock, patched = _pair()
    batch = _build(stock.config, LAYOUTS["clips of different lengths"][:2], padding)
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    check_generate_modes_equal_stock(stock, patched, batch, options)


def test_the_patched_encoder_compiles_without_a_graph_break():
    """Handed the plan, the encoder reads nothing of its mask on the device: one graph (stock's breaks at its windows'
    .item(), the valid frames' nonzero and every layer's split sizes), and stock's outputs (eager backend)."""
    stock, patched = _pair()
    batch = _build(stock.config, LAYOUTS["clips of different lengths"])
    features, mask = batch["input_features"], batch["input_features_mask"]
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].audio
    torch._dynamo.reset()
    stock_breaks = torch._dynamo.explain(traced_copy(stock.model.audio_tower))(features, mask).graph_break_count
    torch._dynamo.reset()
    explained = torch._dynamo.explain(traced_copy(patched.model.audio_tower))(features, mask, syncfree_audio_plan=plan)
    assert explained.graph_break_count == 0 < stock_breaks, [r.reason for r in explained.break_reasons]
    torch._dynamo.reset()
    with torch.no_grad():
        want = stock.model.audio_tower(features, mask).last_hidden_state
        got = torch.compile(traced_copy(patched.model.audio_tower), backend="eager", fullgraph=True)(
            features, mask, syncfree_audio_plan=plan).last_hidden_state
    torch._dynamo.reset()
    assert torch.equal(got, want)
