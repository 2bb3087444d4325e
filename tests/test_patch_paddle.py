"""PaddleOCR-VL: an image-only model whose tower merges after its encoder (tables at merge 1, its learned table
resampled with align_corners=False), called by keyword; parity with stock (attention weights too), the rotary
index against the family's stock function, no syncs and no blocking copies with prepare(), generate, gradients,
backends, compile."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_prepared_prefill_is_sync_and_copy_free,
    check_rope_index_matches_stock,
    model_pair,
    traced_copy,
)
from syncfree.inputs import Image, Text, Video, build_inputs, processor_batch
from syncfree.plan.errors import InputsNotTaken
from syncfree.plan.spec import ModelSpec
from syncfree.plan.vision import vision_plan
from syncfree.plan.vision_tables import host_tables

NAME = "paddleocr-vl-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


LAYOUTS = {  # pixels: multiples of 28 (patch 14, merge 2 in the projector)
    "one image": [[Text(4), Image(84, 112), Text(3)]],
    "images of different sizes": [[Text(2), Image(28, 56), Text(1), Image(112, 28), Text(1), Image(28, 28), Text(2)]],
    "padding and a text-only row": [[Text(2), Image(56, 84), Text(5)], [Text(1), Image(28, 28), Text(1)], [Text(3)]],
}


def test_the_towers_attention_weights_equal_stock():
    stock, patched = _pair("eager")
    batch = processor_batch(stock.config, LAYOUTS["images of different sizes"])
    with torch.no_grad():
        want = stock.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"], output_attentions=True)
        got = patched.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"], output_attentions=True)
    assert len(got.attentions) == len(want.attentions) == stock.config.vision_config.num_hidden_layers
    for g, w in zip(got.attentions, want.attentions):
        assert len(g) == len(w) == 3 and all(torch.equal(a, b) for a, b in zip(g, w))


@settings(max_examples=40, deadline=None)
@given(grid=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=1, max_size=3))
def test_the_plans_tables_are_the_towers_own_merge_1_and_resampling_ones(grid):
    """What the tower's helpers compute (merge 1; the installed embeddings' align_corners on a 4x4 table): the
    plan's tables, made on the device, equal them; a merge-2 table, or the other align_corners, would not."""
    _, patched = _pair()
    grid_thw = torch.tensor([[1, 2 * h, 2 * w] for h, w in grid])
    plan = vision_plan(grid_thw, ModelSpec.from_config(patched.config))
    align = patched.model.visual.vision_model.embeddings.interpolation_align_corners
    assert plan.tables_by_device and plan.tower_tables.merge == 1 and plan.tower_tables.align_corners == align
    for name, table in host_tables(grid_thw, plan.tower_tables).items():
        assert torch.equal(plan.tables()[name], table), name
    from transformers.models.paddleocr_vl import modeling_paddleocr_vl as m

    indices, weights = m.get_vision_interpolation_indices_and_weights(
        grid_thw, num_grid_per_side=4, mode="bilinear", align_corners=align, spatial_merge_size=1)
    assert torch.equal(plan.interp_indices, indices) and torch.equal(plan.interp_weights, weights)
    assert torch.equal(plan.position_ids, m.get_vision_position_ids(grid_thw, 1))


images = st.lists(st.one_of(st.builds(Text, st.integers(1, 4)),
                            st.builds(Image, st.integers(1, 4).map(lambda n: 28 * n),
                                      st.integers(1, 4).map(lambda n: 28 * n))), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=st.lists(images, min_size=1, max_size=3), left=st.booleans(), seed=st.integers(0, 2**16))
def test_rope_index_matches_the_familys_stock_function(samples, left, seed):
    stock, _ = _pair()
    check_rope_index_matches_stock(stock, build_inputs(stock.config, samples, padding_side="left" if left else "right",
                                                       seed=seed))


def test_prepared_prefill_has_no_sync_and_no_blocking_copy_and_moved_inputs_one_sync():
    stock, patched = _pair()
    check_prepared_prefill_is_sync_and_copy_free(
        stock, patched, processor_batch(stock.config, LAYOUTS["images of different sizes"] + LAYOUTS["one image"]))


def test_videos_are_not_a_paddleocr_vl_input():
    config = _pair()[0].config
    with pytest.raises(InputsNotTaken, match="paddleocr_vl takes images only"):
        processor_batch(config, [[Text(2), Video(2, 28, 28)]])


@pytest.mark.parametrize("backend", ["grouped", "block_diagonal"])
def test_attention_backends_equal_stock(backend):
    stock, _ = _pair()
    batch = processor_batch(stock.config, [[Image(56, 56), Image(56, 56), Image(28, 84)]])
    pixels, grid = batch["pixel_values"].unsqueeze(0), batch["image_grid_thw"]
    with torch.no_grad():
        expected = stock.model.visual(pixel_values=pixels, grid_thw=grid).last_hidden_state
        tower = syncfree.patch(copy.deepcopy(stock.model.visual), vision_attention=backend)
        got = tower(pixel_values=pixels, grid_thw=grid).last_hidden_state
    if backend == "block_diagonal":
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    else:
        assert torch.equal(got, expected)


def test_patched_vision_tower_compiles_without_graph_breaks():
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(84, 112), Image(28, 56)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    explained = torch._dynamo.explain(traced_copy(patched.model.visual))(pixel_values=batch["pixel_values"].unsqueeze(0),
                                                            grid_thw=plan.grid_thw, syncfree_vision_plan=plan)
    assert explained.graph_break_count == 0
