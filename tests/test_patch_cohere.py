"""Cohere Compass: Qwen3-VL's code under a text model with sliding-window layers and per-layer-type rope. Parity
with stock over the processor's layouts, the rotary index against the family's stock function, no syncs and no
blocking copies with prepare(), generate (dynamic, static and beams), gradients, compile."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_generate_and_backward_equal_stock,
    check_generate_modes_equal_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    check_rope_index_matches_stock,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.inputs import Image, Text, Video, build_inputs, processor_batch

NAME = "cohere-compass-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


# Pixels are multiples of 32 (patch 16 x merge 2); videos are one run per frame pair, timestamps between.
LAYOUTS = standard_layouts(32)


side = st.integers(1, 4).map(lambda n: 32 * n)
items = st.one_of(st.builds(Text, st.integers(1, 4)), st.builds(Image, side, side),
                  st.builds(Video, st.sampled_from([2, 4, 6]), side, side))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3), left=st.booleans(),
       seed=st.integers(0, 2**16))
def test_rope_index_matches_the_familys_stock_function(rows, left, seed):
    stock, _ = _pair()
    check_rope_index_matches_stock(stock, build_inputs(stock.config, rows, padding_side="left" if left else "right",
                                                       seed=seed))


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


@pytest.mark.parametrize("layout", ["images", "videos"])
def test_generate_and_backward_past_the_sliding_window_equal_stock(layout):
    """The prompt is longer than the sliding window: the cache's sliding layers wrap."""
    stock, patched = _pair()
    samples = ([[Text(2), Image(128, 64), Text(2), Image(64, 64), Text(1)], [Text(1), Image(64, 64), Text(2)]]
               if layout == "images" else [[Text(2), Video(4, 64, 64), Text(1)], [Text(1), Video(2, 64, 96), Text(2)]])
    batch = build_inputs(stock.config, samples, padding_side="left")
    assert batch["input_ids"].shape[1] > stock.config.text_config.sliding_window
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    check_generate_modes_equal_stock(stock, patched, batch, options)


def test_patched_vision_tower_compiles_without_graph_breaks():
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(96, 128), Image(64, 32)]])
    explained = tower_graph_breaks(patched, patched.model.visual, batch)
    assert explained.graph_break_count == 0
