"""Muse Glimmer: a windowed tower (full and window layers called without kwargs) with a learned table read at (w, h),
a pixel shuffle after its encoder and a projector outside it, before a text model without 3D positions. The plan's
tables against stock's helpers on random grids, parity with stock over the processor's layouts, no syncs and no
blocking copies with prepare(), generate (dynamic, static and beams), gradients, compile, vision_every_step refused."""

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
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.inputs import Image, Text, Video, processor_batch

pytestmark = pytest.mark.skipif("muse_glimmer" not in syncfree.families.FAMILIES,
                                reason="this Transformers release has no Muse Glimmer")
NAME = "muse-glimmer-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


def _build(config, samples, padding_side="left"):
    from syncfree.families.muse import build_muse_inputs

    return build_muse_inputs(config, samples, padding_side=padding_side)


# Pixels are multiples of 28 (patch 14 x merge 2); the tiny tower's windows are 4x4 patches (its 4x4 learned table),
# so the larger images and videos have several, some cut by the image's edge.
LAYOUTS = standard_layouts(28)


def test_the_processor_layout():
    """Markers around each image's placeholders, a video's groups joined by separators, no token types."""
    from syncfree.families.muse import MARKERS

    config = _pair()[0].config
    batch = _build(config, [[Text(1), Image(56, 28), Text(1), Video(4, 28, 56), Text(1)]])
    ids = batch["input_ids"][0].tolist()
    assert "mm_token_type_ids" not in batch
    assert ids.count(config.image_token_id) == 2 and ids.count(config.video_token_id) == 2 * 2
    start = ids.index(MARKERS["image_start"])
    assert ids[start + 1:start + 4] == [config.image_token_id] * 2 + [MARKERS["image_end"]]
    assert ids.count(MARKERS["video_sep"]) == 1 and ids.count(MARKERS["video_end"]) == 1
    assert batch["pixel_values"].shape == (1 * 4 * 2, 2 * 3 * 14 * 14)
    # An image's one frame is repeated over the temporal patch (the processor expands it).
    half = batch["pixel_values"].shape[1] // 2
    assert torch.equal(batch["pixel_values"][:, :half], batch["pixel_values"][:, half:])


grids = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(rows=grids, window=st.sampled_from([2, 3, 4, 32]), merge=st.sampled_from([1, 2]))
def test_the_planned_tables_equal_stocks_helpers(rows, window, merge):
    """Every table the plan makes on the device is what stock's helpers give for the same grid and options."""
    from syncfree.plan.traits import PositionTable
    from syncfree.plan.vision_tables import TowerTables, host_tables, tables_from_grid

    grid = torch.tensor([(t, h * merge, w * merge) for t, h, w in rows], dtype=torch.long)
    spec = TowerTables("transformers.models.muse_glimmer.modeling_muse_glimmer", 1, window, window * 14, 14,
                       align_corners=False, table=PositionTable(swap_hw=True, padding="zeros"), pixel_shuffle=merge)
    ours = tables_from_grid(grid, spec)
    stock = host_tables(grid, spec)
    assert ours.keys() == stock.keys() >= {"position_ids", "interp_indices", "interp_weights", "window_index",
                                           "pixel_shuffle_index"}
    assert all(torch.equal(ours[k], v) for k, v in stock.items())


def test_the_tables_are_made_on_the_device():
    """The installed helpers are the ones the device tables stand for (no fallback to host tables)."""
    batch = processor_batch(_pair()[0].config, LAYOUTS["one image"] + LAYOUTS["video"])
    plan = syncfree.prepare(batch, None, _pair()[1])["syncfree_plan"]
    assert plan.image.tables_by_device and plan.video.tables_by_device
    assert plan.image.pixel_shuffle_index is not None and len(plan.image.window_seqlens) > 1


def test_the_towers_attention_weights_equal_stock():
    """Window and full layers both split by the plan's sizes: each layer's per-segment weights are stock's."""
    stock, patched = _pair("eager")
    batch = processor_batch(stock.config, [[Image(28 * 4, 28 * 3), Image(28, 28)]])
    with torch.no_grad():
        want = stock.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"], output_attentions=True)
        got = patched.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"], output_attentions=True)
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)
    assert len(got.attentions) == len(want.attentions) == 3
    for g, w in zip(got.attentions, want.attentions):
        assert torch.equal(g, w)


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


def test_the_patched_tower_compiles_without_a_graph_break():
    """With the plan's tables handed over, the tower reads nothing of its grid on the device: one graph."""
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(112, 84), Image(56, 28)]])
    explained = tower_graph_breaks(patched, patched.model.vision_tower, batch)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]


# ---- Muse Spark: the same tower, a MoE text model and an audio tower --------------------------------------------------
SPARK = "muse-spark-tiny"
needs_spark = pytest.mark.skipif("muse_spark" not in syncfree.families.FAMILIES,
                                 reason="this Transformers release has no Muse Spark")


def _spark_layouts():
    from syncfree.inputs import Waveform

    # Clips of 37 and 20 samples (8 per token): 5 and 3 tokens, the shorter padded by whole silent tokens.
    return {
        "image and audio": [[Text(2), Image(56, 84), Text(1), Waveform(37), Text(2)]],
        "audio, video and a text-only row": [[Text(1), Waveform(37), Video(4, 56, 56), Text(1)],
                                             [Text(2), Waveform(20), Image(28, 28), Text(1)], [Text(3)]],
    }


@needs_spark
def test_spark_audio_layout():
    from syncfree.families.muse import MARKERS

    config = model_pair(SPARK)[0].config
    batch = _build(config, _spark_layouts()["audio, video and a text-only row"])
    assert batch["input_values"].shape == batch["input_values_mask"].shape == (2, 40)
    assert batch["input_values_mask"].dtype == torch.int32 and batch["input_values_mask"].sum(-1).tolist() == [37, 20]
    assert (batch["input_ids"] == config.audio_token_id).sum() == 5 + 3
    assert (batch["input_ids"] == MARKERS["audio_start"]).sum() == 2


@needs_spark
@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", list(_spark_layouts()))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_spark_forward_equals_stock(attn, layout, padding):
    stock, patched = model_pair(SPARK, attn)
    check_forward_equals_stock(stock, patched, _build(stock.config, _spark_layouts()[layout], padding))


@needs_spark
def test_spark_prepared_prefill_has_no_sync_and_no_blocking_copy():
    """In bf16, where the MoE experts take the grouped path (fp32's eager experts keep their documented remainder)."""
    stock, patched = model_pair(SPARK, "sdpa", torch.bfloat16)
    batch = _build(stock.config, _spark_layouts()["audio, video and a text-only row"])
    batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


@needs_spark
def test_spark_generate_and_backward_equal_stock():
    stock, patched = model_pair(SPARK)
    batch = _build(stock.config, _spark_layouts()["audio, video and a text-only row"][:2])
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    check_generate_modes_equal_stock(stock, patched, batch, options)
