"""EXAONE-4.5: Qwen2.5-VL's windowed tower with grouped-query attention, a text model without 3D positions.

Parity with stock (forward, prepare, generate with both caches, gradients), no syncs and no blocking copies
with prepare(), the tower on drawn grids, every attention backend, compile, and the batches stock accepts
because it has no rotary index (touching placeholders, a row of padding only).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_attention_backend_equals_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    traced_copy,
)
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.plan.spec import ModelSpec
from syncfree.plan.vision import vision_plan

NAME = "exaone4.5-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


# Pixels are multiples of 28 (patch 14 x merge 2); 112 px is one 4x4 window of merged patches.
LAYOUTS = {
    "one image": [[Text(4), Image(168, 224), Text(3)]],
    "images of different sizes": [[Text(2), Image(56, 84), Text(1), Image(224, 112), Text(1), Image(28, 28), Text(2)]],
    "video": [[Text(3), Video(6, 112, 140), Text(2)]],
    "image and video": [[Text(2), Image(112, 112), Text(1), Video(4, 56, 84), Text(2)]],
    "padding and a text-only row": [[Text(2), Image(112, 168), Text(5)], [Text(1), Video(2, 56, 56), Text(1)],
                                    [Text(3)]],
}


def test_the_processor_layout_has_no_token_types_and_no_markers():
    config = _pair()[0].config
    batch = build_inputs(config, LAYOUTS["one image"])
    assert "mm_token_type_ids" not in batch  # Exaone4_5_Processor returns none; the forward takes none
    placeholders = (168 // 14) * (224 // 14) // 2**2
    assert int((batch["input_ids"] == config.image_token_id).sum()) == placeholders
    assert batch["input_ids"].shape[1] == 4 + placeholders + 3  # text, placeholders, text: nothing else


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_and_image_hidden_states_equal_stock(attn, layout, padding):
    stock, patched = _pair(attn)
    batch = build_inputs(stock.config, LAYOUTS[layout], padding_side=padding)
    with torch.no_grad():
        expected = stock(**batch)
        assert not expected.logits.isnan().any()
        for inputs in (batch, syncfree.prepare(batch, None, patched)):
            got = patched(**inputs, output_hidden_states=True)
            assert torch.equal(got.logits, expected.logits)
            assert torch.equal(got.image_hidden_states if hasattr(got, "image_hidden_states") else got.logits,
                               expected.image_hidden_states if hasattr(expected, "image_hidden_states")
                               else expected.logits)


def test_placeholders_that_touch_and_a_row_of_padding_run_as_stock_runs_them():
    """Without 3D positions, stock places features in token order whatever the runs, and a row of padding
    only is no error: prepare() accepts what stock accepts."""
    stock, patched = _pair()
    batch = build_inputs(stock.config, [[Text(2), Image(56, 56), Image(28, 56), Text(2)], [Text(3)]])
    batch["attention_mask"][1] = 0
    with torch.no_grad():
        expected = stock(**batch).logits
        assert torch.equal(patched(**batch).logits, expected)
        assert torch.equal(patched(**syncfree.prepare(batch, None, patched)).logits, expected)


grids = st.lists(st.tuples(st.integers(1, 2), st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None)
@given(grid=grids)
def test_vision_tower_and_window_plan_equal_stock_on_drawn_grids(grid):
    from transformers.vision_utils import get_vision_window_index

    stock, patched = _pair()
    grid_thw = torch.tensor([[t, 2 * h, 2 * w] for t, h, w in grid])
    pixels = torch.randn(int(grid_thw.prod(-1).sum()), 3 * 2 * 14 * 14)
    vision = vision_plan(grid_thw, ModelSpec.from_config(patched.config))
    index, cu_windows = get_vision_window_index(grid_thw, 2, 112, 14)
    assert torch.equal(vision.window_index, index)
    assert list(vision.window_seqlens) == (cu_windows[1:] - cu_windows[:-1]).tolist()
    with torch.no_grad():
        want = stock.model.visual(pixels, grid_thw=grid_thw).pooler_output
        assert torch.equal(patched.model.visual(pixels, grid_thw=grid_thw).pooler_output, want)
        assert torch.equal(patched.model.visual(pixels, grid_thw=grid_thw, syncfree_vision_plan=vision).pooler_output,
                           want)


@pytest.mark.parametrize("backend", ["grouped", "block_diagonal", "auto"])
def test_every_attention_backend_handles_grouped_query_heads(backend):
    tower = _pair()[0].model.visual
    assert tower.config.num_key_value_heads < tower.config.num_heads
    grid = torch.tensor([[1, 4, 4], [1, 4, 4], [2, 6, 4]])
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(0))
    check_attention_backend_equals_stock(tower, grid, pixels, backend)


def test_prepared_prefill_has_no_sync_and_no_blocking_copy_and_moved_inputs_one_sync():
    stock, patched = _pair()
    batch = build_inputs(stock.config, LAYOUTS["image and video"] + LAYOUTS["one image"])
    # (use_cache: the generation cache's sliding-window layers are made in this forward too)
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch, use_cache=True)


def test_patched_vision_tower_compiles_without_graph_breaks():
    _, patched = _pair()
    batch = build_inputs(patched.config, [[Image(168, 224), Image(56, 84)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    explained = torch._dynamo.explain(traced_copy(patched.model.visual))(batch["pixel_values"], grid_thw=plan.grid_thw,
                                                            syncfree_vision_plan=plan)
    assert explained.graph_break_count == 0
