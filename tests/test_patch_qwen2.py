"""Qwen2-VL and Qwen2.5-VL: parity with stock, no syncs, window attention, video time scaling."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_prepared_prefill_has_no_sync_and_moved_inputs_one,
    traced_copy,
)
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.plan.spec import ModelSpec
from syncfree.plan.vision import vision_plan
from syncfree.presets import build_model

PRESETS = ("qwen2-vl-tiny", "qwen2.5-vl-tiny")
_pairs: dict = {}


def _pair(name: str, attn: str = "sdpa"):
    if (name, attn) not in _pairs:
        _pairs[name, attn] = build_model(name, attn=attn), syncfree.patch(build_model(name, attn=attn))
    return _pairs[name, attn]


# Sizes in pixels are multiples of 28 (patch 14 x merge 2); 112 px is one 4x4 window of merged patches,
# so 168 x 224 is a grid whose merged size is not a multiple of the window.
LAYOUTS = {
    "one image": [[Text(4), Image(168, 224), Text(3)]],
    "images of different sizes": [[Text(2), Image(56, 84), Text(1), Image(224, 112), Text(1), Image(28, 28), Text(2)]],
    "video": [[Text(3), Video(6, 112, 140, fps=4.0), Text(2)]],
    "videos with different time steps": [[Text(1), Video(4, 56, 56, fps=1.0), Text(2), Video(2, 84, 56, fps=4.0),
                                          Text(1)]],
    "image and video": [[Text(2), Image(112, 112), Text(1), Video(4, 56, 84, fps=2.0), Text(2)]],
    "left padding": [[Text(2), Image(112, 168), Text(5)], [Text(1), Video(2, 56, 56), Text(1)], [Text(3)]],
}


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", PRESETS)
def test_forward_and_rope_index_equal_stock(name, attn, layout, padding):
    stock, patched = _pair(name, attn)
    batch = build_inputs(stock.config, LAYOUTS[layout], padding_side=padding)
    with torch.no_grad():
        expected = stock(**batch).logits
        expected_deltas = stock.model.rope_deltas
        assert not expected.isnan().any()
        assert torch.equal(patched(**batch).logits, expected)
        assert torch.equal(patched(**syncfree.prepare(batch, None, patched)).logits, expected)
        assert torch.equal(patched.model.rope_deltas, expected_deltas)
        rope_args = {k: batch.get(k) for k in ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw",
                                               "attention_mask")}
        if "second_per_grid_ts" in batch:
            rope_args["second_per_grid_ts"] = batch["second_per_grid_ts"]
        for got, want in zip(patched.model.get_rope_index(**rope_args), stock.model.get_rope_index(**rope_args)):
            assert got.dtype == want.dtype and torch.equal(got, want)


grids = st.lists(st.tuples(st.integers(1, 2), st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None)
@given(grid=grids)
@pytest.mark.parametrize("name", PRESETS)
def test_vision_tower_and_window_plan_equal_stock_on_random_grids(name, grid):
    stock, patched = _pair(name)
    grid_thw = torch.tensor([[t, 2 * h, 2 * w] for t, h, w in grid])
    pixels = torch.randn(int(grid_thw.prod(-1).sum()), 3 * 2 * 14 * 14)
    vision = vision_plan(grid_thw, ModelSpec.from_config(patched.config))
    if name == "qwen2.5-vl-tiny":
        from transformers.vision_utils import get_vision_window_index

        index, cu_windows = get_vision_window_index(grid_thw, 2, 112, 14)
        assert torch.equal(vision.window_index, index)
        assert list(vision.window_seqlens) == (cu_windows[1:] - cu_windows[:-1]).tolist()
        # The inverse permutation the tower applies at the end restores the original order.
        assert torch.equal(index[torch.argsort(index)], torch.arange(index.numel()))
    with torch.no_grad():
        want = stock.model.visual(pixels, grid_thw=grid_thw).pooler_output
        assert torch.equal(patched.model.visual(pixels, grid_thw=grid_thw).pooler_output, want)
        assert torch.equal(patched.model.visual(pixels, grid_thw=grid_thw, syncfree_vision_plan=vision).pooler_output,
                           want)


@pytest.mark.parametrize("name", PRESETS)
def test_prepared_prefill_has_no_sync_and_moved_inputs_one(name):
    stock, patched = _pair(name)
    batch = build_inputs(stock.config, LAYOUTS["image and video"] + LAYOUTS["one image"], padding_side="left")
    check_prepared_prefill_has_no_sync_and_moved_inputs_one(stock, patched, batch)


@pytest.mark.parametrize("name", PRESETS)
def test_patched_vision_tower_compiles_without_graph_breaks(name):
    _, patched = _pair(name)
    batch = build_inputs(patched.config, [[Image(168, 224), Image(56, 84)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    explained = torch._dynamo.explain(traced_copy(patched.model.visual))(batch["pixel_values"], grid_thw=plan.grid_thw,
                                                            syncfree_vision_plan=plan)
    assert explained.graph_break_count == 0


def test_video_time_steps_must_match_the_videos():
    stock, patched = _pair("qwen2.5-vl-tiny")
    batch = build_inputs(stock.config, LAYOUTS["videos with different time steps"])
    batch["second_per_grid_ts"] = batch["second_per_grid_ts"][:1]
    with pytest.raises(ValueError, match="second_per_grid_ts has 1 entries but video_grid_thw describes 2 videos"):
        syncfree.prepare(batch, None, patched)
