"""ERNIE-4.5-VL: parity with stock over the processor's layouts (a video's frames paired by the resampler), the
rotary index against the family's stock function, the MoE's text and vision experts fed by planned rows (router
logits and the auxiliary loss too), no syncs and no blocking copies with prepare(), generate, gradients, compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_forward_equals_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    check_rope_index_matches_stock,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.families.ernie import build_ernie_inputs
from syncfree.inputs import Image, Text, Video, processor_batch
from syncfree.plan.active import StalePlan

NAME = "ernie4.5-vl-tiny"


def _pair(attn: str = "sdpa", dtype=torch.float32):
    return model_pair(NAME, attn, dtype)


# Pixels are multiples of 28 (patch 14 x merge 2); video frames come in pairs (temporal_merge_size 2).
LAYOUTS = standard_layouts(28)


def test_the_moe_types_mark_each_items_markers_too():
    config = _pair()[0].config
    batch = build_ernie_inputs(config, LAYOUTS["image and videos"])
    ids, moe = batch["input_ids"], batch["moe_mm_token_type_ids"]
    for kind, marks in ((1, (config.image_start_token_id, config.image_token_id, config.image_end_token_id)),
                        (2, (config.video_start_token_id, config.video_token_id, config.video_end_token_id))):
        assert torch.equal(moe == kind, sum(ids == m for m in marks).bool())
        assert torch.equal(batch["mm_token_type_ids"] == kind, ids == marks[1])
    # A video of 4 frames of 2x2 merged patches pairs its frames: 2 * 4 placeholders.
    assert int((ids == config.video_token_id).sum()) == 2 * 4 + 1 * 2


def test_router_logits_and_the_auxiliary_loss_equal_stock():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and videos"])
    with torch.no_grad():
        want = stock(**batch, output_router_logits=True)
        for inputs in (batch, syncfree.prepare(batch, None, patched)):
            got = patched(**inputs, output_router_logits=True)
            assert len(got.router_logits) == len(want.router_logits) > 0
            assert all(torch.equal(g, w) for g, w in zip(got.router_logits, want.router_logits))
            assert torch.equal(got.aux_loss, want.aux_loss)


def test_a_batch_without_moe_types_runs_every_token_through_the_text_experts_as_stock():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["images of different sizes"])
    del batch["moe_mm_token_type_ids"]
    check_forward_equals_stock(stock, patched, batch)


def test_moe_types_edited_after_prepare_are_refused():
    _, patched = _pair()
    kwargs = syncfree.prepare(processor_batch(patched.config, LAYOUTS["one image"]), "cpu", patched)
    kwargs["moe_mm_token_type_ids"][0, 0] = 1
    with pytest.raises(StalePlan, match="moe_mm_token_type_ids"):
        patched(**kwargs)


side = st.integers(1, 4).map(lambda n: 28 * n)
items = st.one_of(st.builds(Text, st.integers(1, 4)), st.builds(Image, side, side),
                  st.builds(Video, st.sampled_from([2, 4, 6]), side, side))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3), left=st.booleans(),
       seed=st.integers(0, 2**16))
def test_rope_index_matches_the_familys_stock_function(rows, left, seed):
    stock, _ = _pair()
    check_rope_index_matches_stock(stock, build_ernie_inputs(stock.config, rows, padding_side="left" if left else
                                                             "right", seed=seed))


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    # (bf16: the experts' grouped matmul has no host read there; in fp32 it reads its group sizes, as in every MoE.)
    stock, patched = _pair(dtype=torch.bfloat16)
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][2:])
    batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


def test_patched_vision_tower_compiles_without_graph_breaks():
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(84, 112), Image(56, 28)]])
    explained = tower_graph_breaks(patched, patched.model.vision_tower, batch)
    assert explained.graph_break_count == 0

