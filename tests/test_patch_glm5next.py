"""GLM-5-Next: GLM-OCR's tower before a hybrid text model with a pooled DSA indexer, without 3D positions; video frames
use the image placeholder, told apart by the video start/end spans. Parity with stock over the processor's layouts,
the pooled indexer's kept pools against stock on drawn padding masks, no syncs and no blocking copies with prepare()
(and none in the indexer's decode steps), generate (dynamic, static and beams), gradients, compile."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    prepared_generate_audited,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.families.glm5next.pooled_keep import kept_pools, kept_prefix, pools_written
from syncfree.inputs import Image, Text, Video, processor_batch
from syncfree.plan import active
from syncfree.plan.batch import build_plan
from syncfree.plan.spec import ModelSpec

pytestmark = pytest.mark.skipif("glm5_next" not in syncfree.families.FAMILIES,
                                reason="this Transformers release has no GLM-5-Next in the form syncfree supports")
NAME = "glm5-next-tiny"


def _pair(attn: str = "sdpa", dtype=torch.float32):
    return model_pair(NAME, attn, dtype)


def _inputs(config, samples, padding_side="left"):
    from syncfree.families.glm5next import build_glm5next_inputs

    return build_glm5next_inputs(config, samples, padding_side=padding_side)


# Pixels are multiples of 28 (patch 14 x merge 2). Images and videos mix: stock counts them apart by the video spans.
LAYOUTS = standard_layouts(28)


def test_video_frames_are_image_placeholders_typed_by_their_span():
    config = _pair()[0].config
    batch = processor_batch(config, LAYOUTS["image and videos"])
    ids, types = batch["input_ids"], batch["mm_token_type_ids"]
    in_span = (ids == config.video_start_token_id).cumsum(-1) > (ids == config.video_end_token_id).cumsum(-1)
    image = ids == config.image_token_id
    assert torch.equal(types == 1, image & ~in_span) and torch.equal(types == 2, image & in_span)
    assert (types == 1).any() and (types == 2).any() and not (ids == config.video_token_id).any()
    # a begin/end of image per image and per temporal patch of each video (4 and 2 frames: 2 + 1 patches)
    assert int((ids == config.image_start_token_id).sum()) == int((ids == config.image_end_token_id).sum()) == 1 + 3


def test_prepare_refuses_token_types_that_are_not_the_spans():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and videos"])
    batch["mm_token_type_ids"] = batch["mm_token_type_ids"].clamp(max=1)  # video frames typed as images
    with pytest.raises(ValueError, match="outside video spans"):
        syncfree.prepare(batch, None, patched)


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    # bf16: the MoE experts take the grouped-matmul path (fp32 keeps the documented eager-experts remainder).
    stock, patched = _pair(dtype=torch.bfloat16)
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


def _stock_keep(valid: torch.Tensor, kpool: int) -> torch.Tensor:
    """Stock's ``pool_valid.any(0)``, from its own get_pooled_states on states whose valid channel is ``valid``."""
    stock, _ = _pair()
    stock_fn = type(next(m for m in stock.modules() if type(m).__name__ == "Glm5NextTextIndexer")).get_pooled_states
    dim = 8
    indexer = SimpleNamespace(head_dim=dim, index_kpool=kpool, index_kpool_compress_ape=torch.zeros(kpool, dim))
    packed = torch.cat([torch.randn(*valid.shape, 2 * dim), valid[..., None].float()], -1)
    _, indices, _ = stock_fn(indexer, packed)
    return indices  # (rows, kept pools, kpool): its second size is the number of kept pools


def _mask(draw_rows, width):
    return torch.tensor([[1 if lo <= i < hi else 0 for i in range(width)] for lo, hi in draw_rows])


runs = st.integers(1, 4).flatmap(lambda rows: st.integers(8, 40).flatmap(lambda width: st.tuples(
    st.just(width), st.lists(st.tuples(st.integers(0, width), st.integers(0, width)).map(sorted),
                             min_size=rows, max_size=rows))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs, st.integers(1, 6), st.booleans())
def test_kept_prefix_is_stocks_keep_for_contiguous_rows(drawn, kpool, hole):
    width, rows = drawn
    mask = _mask(rows, width)
    if hole:  # a hole inside some row's run: then the prefix is not claimed
        row = max(range(len(rows)), key=lambda r: rows[r][1] - rows[r][0])
        lo, hi = rows[row]
        if hi - lo >= 3:
            mask[row, (lo + hi) // 2] = 0
    n_kept = _stock_keep(mask, kpool).shape[1]
    prefix = kept_prefix(mask.numpy(), kpool)
    contiguous = all(((r[1:] > r[:-1]).sum() + r[0]) <= 1 for r in mask.numpy())
    assert (prefix is None) == (not contiguous)
    if prefix is not None:
        assert prefix == n_kept


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs, st.booleans())
def test_the_patched_indexer_equals_stock_on_padded_masks(drawn, prefill_of_generate):
    """The patched indexer (its forward, pools and top-k) against stock's with the plan of these padded rows active;
    where the rows are contiguous it takes the pools by the host prefix (the index it makes is not a boolean)."""
    width, rows = drawn
    mask = _mask(rows, width)
    stock, patched = _pair()
    pick = lambda m: next(x for x in m.modules() if type(x).__name__ == "Glm5NextTextIndexer")  # noqa: E731
    want_indexer, got_indexer = pick(stock), pick(patched)
    g = torch.Generator().manual_seed(width)
    hidden = torch.randn(len(rows), width, stock.config.text_config.hidden_size, generator=g)
    q_resid = torch.randn(len(rows), width, stock.config.text_config.q_lora_rank, generator=g)
    ids = torch.full(mask.shape, 7)
    plan = build_plan(ModelSpec.from_config(stock.config), input_ids=ids, attention_mask=mask)
    entry = active.Entry(plan, ids, mask, in_generate=prefill_of_generate)
    with torch.no_grad(), active.activate(entry):
        got = got_indexer(hidden, q_resid, mask.bool(), None)
        packed = torch.cat([torch.randn(*mask.shape, 32), mask[..., None].float()], -1)
        pools_written(packed, width, width, width)
        kept = kept_pools(torch.zeros(len(rows), width, dtype=torch.bool), packed, packed[..., -1].bool(), 4)
    with torch.no_grad():
        want = want_indexer(hidden, q_resid, mask.bool(), None)
    assert torch.equal(got, want)
    contiguous = kept_prefix(mask.numpy(), 4) is not None
    assert (kept.dtype == torch.int64) == contiguous


def _pooled_syncs(report) -> int:
    return len([e for e in report.syncs if any(f.function == "get_pooled_states" for f in e.stack)])


@pytest.mark.parametrize("padding", ["left", "right"])
def test_the_indexers_decode_steps_do_not_sync_where_the_mask_stays_one_run(padding):
    """Left padding stays one run per row as generate() appends ones: no pooled-keep read in the prefill nor in any
    decode step. Right padding gets a hole once tokens follow the pads: stock's select there (still stock's ids)."""
    stock, patched = _pair(dtype=torch.bfloat16)
    batch = _inputs(stock.config, [[Text(3), Image(56, 56), Text(2)], [Text(2)]], padding)
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    ids, expected, report = prepared_generate_audited(stock, patched, batch, options)
    assert torch.equal(ids, expected)
    layers = sum(t == "indexed_attention" for t in stock.config.text_config.layer_types)
    # Right padding: the prefill is one run per row, the 2 decode steps that attend to a hole select as stock does.
    assert _pooled_syncs(report) == (0 if padding == "left" else 2 * 3 * layers)


def test_beams_with_a_video_fail_as_stock_fails():
    """Stock's _expand_multimodal_outputs counts a video's placeholders by video_token_id, which its processor never
    writes (frames use the image placeholder): beam search over a video fails; the patched model fails alike."""
    stock, patched = _pair()
    batch = _inputs(stock.config, [[Text(2), Video(2, 56, 56), Text(1)]])
    options = dict(max_new_tokens=2, do_sample=False, pad_token_id=0, eos_token_id=None, num_beams=2)
    with torch.no_grad():
        with pytest.raises(Exception) as want:
            stock.generate(**batch, **options)
        with pytest.raises(type(want.value)) as got:
            patched.generate(**syncfree.prepare(batch, None, patched), **options)
    assert str(got.value) == str(want.value)


def test_the_patched_tower_compiles_without_a_graph_break():
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(84, 112), Image(56, 28)]])
    assert tower_graph_breaks(patched, patched.model.visual, batch).graph_break_count == 0
