"""Cosmos3-Edge: a SigLIP-style tower handed only the planned segment sizes, its attention's one-statement split,
Qwen3-VL's rotary index (with Cosmos's clone) against the family's stock function, no syncs and no blocking copies
with prepare(), generate, gradients, backends."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_attention_backend_equals_stock,
    check_forward_equals_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    check_rope_index_matches_stock,
    model_pair,
    standard_layouts,
    traced_copy,
)
from syncfree.inputs import Image, Text, Video, build_inputs, processor_batch
from syncfree.presets import build_model

pytest.importorskip("transformers.models.cosmos3_edge.modeling_cosmos3_edge")
NAME = "cosmos3-edge-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


# Pixels are multiples of 32 (patch 16 x merge 2); one frame per temporal step.
LAYOUTS = {
    "one image": [[Text(4), Image(64, 96), Text(3)]],
    "images of different sizes": [[Text(2), Image(32, 64), Text(1), Image(96, 32), Text(1), Image(32, 32), Text(2)]],
    "video": [[Text(3), Video(3, 64, 32), Text(2)]],
    "image and video": [[Text(2), Image(64, 64), Text(1), Video(2, 32, 64), Text(2)]],
    "padding and a text-only row": [[Text(2), Image(64, 32), Text(5)], [Text(1), Video(2, 32, 32), Text(1)],
                                    [Text(3)]],
}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_equals_stock_on_its_own_layouts(attn, layout, padding):
    stock, patched = _pair(attn)
    batch = build_inputs(stock.config, LAYOUTS[layout], padding_side=padding)  # (Cosmos's processor layout)
    check_forward_equals_stock(stock, patched, batch)


side = st.integers(1, 3).map(lambda n: 32 * n)
items = st.one_of(st.builds(Text, st.integers(1, 5)), st.builds(Image, side, side),
                  st.builds(Video, st.integers(1, 3), side, side, st.sampled_from([1.0, 2.0])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_rope_index_matches_the_familys_stock_function(samples, seed):
    stock, _ = _pair()
    check_rope_index_matches_stock(stock, processor_batch(stock.config, samples, seed=seed))


def test_prepared_prefill_has_no_sync_and_no_blocking_copy_and_the_attention_gets_no_rotary_ids():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and video"] + LAYOUTS["one image"])
    seen = []
    hooks = [m.register_forward_pre_hook(lambda m, args, kwargs: seen.append(set(kwargs)), with_kwargs=True)
             for m in patched.modules() if type(m).__name__ == "Cosmos3EdgeVisionAttention"]
    try:
        check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)
    finally:
        for hook in hooks:
            hook.remove()
    # Everything the tower is handed travels on to the attention function: flash attention reads position_ids.
    assert seen and all("syncfree_seqlens" in keys and "position_ids" not in keys for keys in seen)


@pytest.mark.parametrize("backend", ["grouped", "block_diagonal"])
def test_attention_backends_equal_stock(backend):
    tower = _pair()[0].model.visual
    grid = torch.tensor([[1, 2, 2], [1, 2, 2], [3, 2, 4]])
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 16 * 16, generator=torch.Generator().manual_seed(0))
    check_attention_backend_equals_stock(tower, grid, pixels, backend, output="last_hidden_state")


def test_the_towers_graph_breaks_are_only_its_per_grid_row_resampling():
    """The tower compiled alone, handed its vision plan (``compile_vision``'s way), breaks only where its antialiased
    resampling loops over ``grid_thw.tolist()`` (a host read with the plan's host grid, but data-dependent for Dynamo);
    the whole forward traced with its plan reads the plan's rows there (tests/test_one_graph.py)."""
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(64, 96), Image(32, 64)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    explained = torch._dynamo.explain(traced_copy(patched.model.visual))(batch["pixel_values"], grid_thw=plan.grid_thw,
                                                            syncfree_vision_plan=plan)
    assert explained.graph_break_count > 0
    assert all("resize_positional_embeddings" in str(r.user_stack) for r in explained.break_reasons)


def test_the_rewritten_resampling_stays_a_staticmethod_bound_patched_and_pickled():
    """Stock's position resampling is a ``staticmethod`` (its grid read is rewritten for a traced forward): the patched
    instance's attribute takes stock's arguments without an instance, gives stock's values, and survives pickling and
    ``unpatch``."""
    # (models of its own: the session's shared pair may carry an earlier test's hooks, e.g. a training test's
    # ``enable_input_require_grads``, which pickling cannot take)
    stock, patched = build_model(NAME), syncfree.patch(build_model(NAME))
    cls = type(stock.model.visual.embeddings)
    assert isinstance(cls.__dict__["resize_positional_embeddings"], staticmethod)  # (the class itself is untouched)
    table = torch.randn(4, 4, 8)  # (height, width, hidden), a learned reference grid
    grid = torch.tensor([[1, 4, 6], [2, 2, 2]])
    want = stock.model.visual.embeddings.resize_positional_embeddings(table, grid, 2)
    mine = patched.model.visual.embeddings
    assert "resize_positional_embeddings" in mine.__dict__  # (patched on the instance)
    assert torch.equal(mine.resize_positional_embeddings(table, grid, 2), want)
    batch = build_inputs(stock.config, LAYOUTS["image and video"])
    with torch.no_grad():
        expected = patched(**batch).logits
    buffer = io.BytesIO()
    torch.save(patched, buffer)
    buffer.seek(0)
    for restored in (pickle.loads(pickle.dumps(patched)), torch.load(buffer, weights_only=False)):
        assert syncfree.is_patched(restored)
        assert "resize_positional_embeddings" in restored.model.visual.embeddings.__dict__
        with torch.no_grad():
            assert torch.equal(restored(**batch).logits, expected)
        syncfree.unpatch(restored)
        assert "resize_positional_embeddings" not in restored.model.visual.embeddings.__dict__
        assert not syncfree.is_patched(restored)
