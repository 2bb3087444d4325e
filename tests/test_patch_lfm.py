"""LFM3-VL: a tower with convolution layers whose projector merges after it, before a hybrid text model without 3D
positions. Parity with stock over the processor's layouts (the attention's weights too), no syncs and no blocking
copies with prepare(), generate (dynamic, static and beams), gradients, compile, vision_every_step refused."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from family_checks import (
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.inputs import Image, processor_batch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers.models.lfm3_vl") is None,
                                reason="this Transformers release has no LFM3-VL")
NAME = "lfm3-vl-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


# Pixels are multiples of 32 (patch 16 x merge 2); a video frame pair is its timestamp, start id, placeholders, end id.
LAYOUTS = standard_layouts(32)


def test_the_processor_layout_has_no_token_types():
    batch = processor_batch(_pair()[0].config, LAYOUTS["image and videos"])
    assert "mm_token_type_ids" not in batch and {"image_grid_thw", "video_grid_thw"} <= set(batch)


def test_the_towers_attention_weights_equal_stock():
    stock, patched = _pair("eager")
    batch = processor_batch(stock.config, LAYOUTS["images of different sizes"])
    with torch.no_grad():
        want = stock.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"], output_attentions=True)
        got = patched.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"], output_attentions=True)
    assert len(got.attentions) == len(want.attentions) > 0
    for g, w in zip(got.attentions, want.attentions):
        assert len(g) == len(w) == 3 and all(torch.equal(a, b) for a, b in zip(g, w))


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


def test_the_patched_towers_one_graph_break_is_its_own_grid_read():
    """Stock reads its grid with .tolist() for the convolutions' per-frame reshapes: on the plan's host grid that is no
    sync, but torch.compile breaks the graph there (once); nothing else breaks."""
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(96, 128), Image(64, 32)]])
    explained = tower_graph_breaks(patched, patched.model.vision_tower, batch)
    assert explained.graph_break_count == 1
    assert "grid_thw.tolist()" in str(explained.break_reasons[0].user_stack[-1].line)

