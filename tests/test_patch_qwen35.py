"""Qwen3.5 and Qwen3.5-MoE: Qwen3-VL's vision tower before a hybrid gated-DeltaNet / attention text model.

Parity with stock (fp32 on the CPU, bit for bit), no syncs with prepare() and one without (the MoE
model in bfloat16, where its experts' grouped matmul has a sync-free CUDA kernel), generate and
gradients, the rope index against stock on random layouts, and a vision tower that compiles whole.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_prepared_prefill_has_no_sync_and_moved_inputs_one,
    model_pair,
    standard_layouts,
    traced_copy,
)
from syncfree.audit import assert_no_sync, emulate_cuda
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.plan.rope import rope_index
from syncfree.presets import build_model

transformers_has = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5",
                                       reason="this Transformers release has no Qwen3.5")

PRESETS = ("qwen3.5-tiny", "qwen3.5-moe-tiny")
_pair = model_pair


# Pixel sizes are multiples of 32 (patch 16 x merge 2). Videos are one placeholder run per frame,
# with a timestamp between frames, as Qwen3-VL lays them out.
LAYOUTS = {
    "one image": [[Text(4), Image(64, 96), Text(3)]],
    "images of different sizes": [[Text(2), Image(32, 64), Text(1), Image(96, 32), Text(1), Image(32, 32), Text(2)]],
    "video": [[Text(3), Video(6, 64, 64, fps=2.0), Text(2)]],
    "image and video": [[Text(2), Image(64, 64), Text(1), Video(4, 32, 64, fps=2.0), Text(2)]],
    "text-only row": [[Text(2), Image(64, 32), Text(5)], [Text(1), Video(2, 32, 32), Text(1)], [Text(3)]],
}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", PRESETS)
def test_forward_equals_stock_on_its_own_layouts(name, attn, layout, padding):
    stock, patched = _pair(name, attn)
    batch = build_inputs(stock.config, LAYOUTS[layout], padding_side=padding)
    with torch.no_grad():
        expected = stock(**batch).logits
        expected_deltas = stock.model.rope_deltas
        assert not expected.isnan().any()
        assert torch.equal(patched(**batch).logits, expected)
        assert torch.equal(patched(**syncfree.prepare(batch, "cpu", patched)).logits, expected)
        assert torch.equal(patched.model.rope_deltas, expected_deltas)


runs = st.lists(st.one_of(st.tuples(st.just("text"), st.integers(1, 4)),
                          st.tuples(st.just("image"), st.integers(1, 3), st.integers(1, 3)),
                          st.tuples(st.just("video"), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2))),
                min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(runs, min_size=1, max_size=3), padding=st.sampled_from(["left", "right"]))
def test_rope_index_equals_stock_on_random_layouts(rows, padding):
    stock, _ = _pair("qwen3.5-tiny")
    samples = [[Text(n[1]) if n[0] == "text" else Image(32 * n[1], 32 * n[2]) if n[0] == "image"
                else Video(2 * n[1], 32 * n[2], 32 * n[3]) for n in row] for row in rows]
    batch = build_inputs(stock.config, samples, padding_side=padding)
    args = {k: batch.get(k) for k in ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw",
                                      "attention_mask")}
    if args["image_grid_thw"] is None and args["video_grid_thw"] is None:
        return
    want = stock.model.get_rope_index(**{k: v.clone() if v is not None else None for k, v in args.items()})
    got = rope_index(*args.values(), spatial_merge_size=2, split_video_frames=True)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.parametrize("name, dtype", [("qwen3.5-tiny", torch.float32), ("qwen3.5-moe-tiny", torch.bfloat16)])
def test_prepared_prefill_has_no_sync_and_moved_inputs_one(name, dtype):
    stock, patched = _pair(name, dtype=dtype)
    batch = build_inputs(stock.config, LAYOUTS["image and video"] + LAYOUTS["one image"], padding_side="left")
    check_prepared_prefill_has_no_sync_and_moved_inputs_one(stock, patched, batch)


def test_patched_vision_tower_compiles_without_graph_breaks():
    # Own models: Dynamo keeps weak references to the parameters, after which model.to() cannot swap them.
    stock, patched = build_model("qwen3.5-tiny"), syncfree.patch(build_model("qwen3.5-tiny"))
    batch = build_inputs(patched.config, [[Image(64, 96), Image(32, 64)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    explained = torch._dynamo.explain(traced_copy(patched.model.visual))(batch["pixel_values"], grid_thw=plan.grid_thw,
                                                            syncfree_vision_plan=plan)
    assert explained.graph_break_count == 0
    stock_explained = torch._dynamo.explain(traced_copy(stock.model.visual))(batch["pixel_values"], grid_thw=plan.grid_thw)
    assert stock_explained.graph_break_count > 0


def test_the_recurrent_layers_padding_check_is_answered_on_the_host():
    # Stock asks `torch.all(attention_mask == 1)` on the device for the gated-DeltaNet layers' mask.
    stock, patched = _pair("qwen3.5-tiny")
    batch = build_inputs(stock.config, [[Text(5)], [Text(3)]], padding_side="left")  # text only, padded
    with torch.no_grad(), emulate_cuda():
        for model in (stock, patched):
            model.to("cuda")
        try:
            moved = {k: v.to("cuda") for k, v in batch.items()}
            with syncfree.audit() as stock_report:
                stock(**moved)
            with assert_no_sync():
                patched(**syncfree.prepare(batch, "cuda", patched))
        finally:
            for model in (stock, patched):
                model.to("cpu")
    assert any("torch.all(attention_mask == 1)" in e.where.code for e in stock_report.syncs)
