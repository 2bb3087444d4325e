"""HunYuan-VL: a tower without rotary ids whose merger adds a newline per merged row and a begin and an end per image,
before a text model with its own multimodal rotary index (four axes). Parity with stock over the processor's layouts
(images only), the plan's positions against the family's stock index, no syncs and no blocking copies with prepare(),
generate (dynamic, static and beams), gradients, compile."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_forward_equals_stock,
    check_host_index_is_stocks,
    check_prepared_prefill_is_sync_and_copy_free,
    edited_first_row,
    first_row_edit_cases,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.inputs import Image, Text, Video, processor_batch
from syncfree.plan.errors import InputsNotTaken
from syncfree.rewrite.recomputed_op import class_path

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers.models.hunyuan_vl") is None,
                                reason="this Transformers release has no HunYuan-VL")
NAME = "hunyuan-vl-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


def _inputs(config, samples, padding_side="left", seed=0):
    from syncfree.families.hunyuan import build_hunyuan_inputs

    return build_hunyuan_inputs(config, samples, padding_side=padding_side, seed=seed)


# Pixels are multiples of 32 (patch 16 x merge 2); the merger needs at least 2 patches on a side (stock checks it).
U = 32
LAYOUTS = {
    "one image": [[Text(4), Image(3 * U, 4 * U), Text(3)]],
    "images of different sizes": [[Text(2), Image(U, 2 * U), Text(1), Image(4 * U, U), Text(1), Image(U, U),
                                   Text(2)]],
    "images first and last": [[Image(2 * U, U), Text(3), Image(U, 3 * U)]],
    "padding and a text-only row": [[Text(2), Image(2 * U, 3 * U), Text(5)], [Text(1), Image(U, U), Text(1),
                                                                              Image(U, 2 * U)], [Text(3)]],
}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


def test_the_processor_layout():
    """An image is im_start, lh * (lw + 1) + 2 image placeholders typed 1, im_end (HunYuanVLProcessor)."""
    config = _pair()[0].config
    batch = processor_batch(config, [[Text(2), Image(2 * U, 3 * U), Text(1)]])
    assert set(batch) == {"input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"}
    ids = batch["input_ids"][0].tolist()
    tokens = 2 * (3 + 1) + 2
    assert ids[2:2 + tokens + 2] == [config.im_start_id] + [config.image_token_id] * tokens + [config.im_end_id]
    assert batch["mm_token_type_ids"][0].tolist() == [int(i == config.image_token_id) for i in ids]
    assert batch["image_grid_thw"].tolist() == [[1, 4, 6]] and tuple(batch["pixel_values"].shape) == (24, 3 * 16 * 16)
    with pytest.raises(InputsNotTaken, match="images and text only"):
        processor_batch(config, [[Text(2), Video(2, U, U)]])


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_equals_stock_on_its_own_layouts(attn, layout, padding):
    stock, patched = _pair(attn)
    check_forward_equals_stock(stock, patched, _inputs(stock.config, LAYOUTS[layout], padding))


side = st.integers(1, 4).map(lambda n: U * n)
items = st.one_of(st.builds(Text, st.integers(1, 4)), st.builds(Image, side, side))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3), left=st.booleans(),
       seed=st.integers(0, 2**16))
def test_the_plans_positions_are_the_familys_stock_index(rows, left, seed):
    """The plan's positions (stock's index run on the host copies), the patched index without a plan (one read, then
    the same) and on a prepared batch (its plan's) against stock's index on the batch: every axis, row and delta."""
    stock, patched = _pair()
    batch = _inputs(stock.config, rows, "left" if left else "right", seed)
    if "image_grid_thw" not in batch:
        return  # (a text-only batch: stock computes no multimodal positions)
    args = {k: batch[k] for k in ("input_ids", "mm_token_type_ids", "image_grid_thw", "attention_mask")}
    want = stock.model.get_rope_index(**args)
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
    prepared = syncfree.prepare(batch, "cpu", patched)  # (registered: the index answers from its plan)
    for got in ((plan.position_ids, plan.rope_deltas), patched.model.get_rope_index(**args),
                patched.model.get_rope_index(**{k: prepared[k] for k in args})):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)
    assert want[0].shape[0] == len(stock.config.text_config.rope_parameters["mrope_section"]) == 4


def test_the_placeholder_check_raises_stocks_error():
    """A placeholder short: stock's ValueError and message, from the plan's count (no selection by the mask)."""
    stock, patched = _pair()
    batch = _inputs(stock.config, LAYOUTS["one image"])
    ids = batch["input_ids"]
    ids[0, (ids[0] == stock.config.image_token_id).nonzero()[5, 0]] = 7
    batch["mm_token_type_ids"] = (ids == stock.config.image_token_id).long()
    errors = []
    for model in (stock, patched):
        with pytest.raises(ValueError) as raised, torch.no_grad():
            model(**batch)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and errors[0].startswith("Image features and image tokens do not match")


def test_grids_out_of_order_are_refused_as_stock_refuses_them():
    """The grids of two images listed in the wrong order (same totals): prepare() names the runs that do not match,
    and the patched forward raises stock's own error (its index, which the plan leaves to stock for such a batch)."""
    stock, patched = _pair()
    batch = _inputs(stock.config, [[Text(2), Image(U, 2 * U), Text(1), Image(2 * U, 2 * U), Text(1)]])
    batch["image_grid_thw"] = batch["image_grid_thw"].flip(0)
    with pytest.raises(ValueError, match=r"runs in the tokens have \[5, 8\] tokens .* of \[8, 5\] tokens"):
        syncfree.prepare(batch, None, patched)
    errors = []
    for model in (stock, patched):
        with pytest.raises(ValueError) as raised, torch.no_grad():
            model(**batch)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and "span length does not match" in errors[0]


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["padding and a text-only row"])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


_GRID_HELPERS = ("grid_products", "grid_list", "grid_rows", "item_patches", "listed_rows")  # (shared; the family's)


def test_the_patched_towers_graph_breaks_are_its_own_grid_reads():
    """The tower's per-image loops (the position table's resampling, the merger) run over the plan's host grid: no
    sync. The tower traced alone breaks the graph only where stock reads that grid into Python: the merger's
    ``.tolist()`` (its split sizes and its loop), and with older Transformers/torch the resampling loop over the grid's
    rows too. (Inside a prepared forward those reads are the plan's rows: one graph, tests/test_one_graph.py.)"""
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(96, 128), Image(64, 32)]])
    explained = tower_graph_breaks(patched, patched.model.vision_tower, batch)
    frames = [r.user_stack[-1] for r in explained.break_reasons]
    lines = [str(f.line).strip() for f in frames]
    grid_reads = ["for t, h, w in grid_thw:", "split_sizes = grid_thw.prod(dim=-1).tolist()",
                  "for grid, item in zip(grid_thw.tolist(), split_items):"]
    # (the merger's reads are stock's expressions inside the grid helpers its edits call: the plan's rows in a traced
    # forward, stock's expression in a tower traced without its forward's plan, as here)
    assert lines and all(line in grid_reads or f.name in _GRID_HELPERS for line, f in zip(lines, frames)), lines


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**first_row_edit_cases(st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3)))
def test_the_numpy_index_is_stocks(rows, left, seed, masked, edits):
    """The plan's NumPy index (``families/hunyuan/rope.hunyuan_rope_index``) against stock's own ``get_rope_index`` run on
    the same host tensors, over random layouts (either padding, with and without a mask, text-only rows) and the same
    with a few tokens dropped, inserted or retyped: where it answers, every position and delta is stock's; where it
    does not, the plan runs stock's own index. The processor's own layouts it must answer."""
    from syncfree.families.hunyuan.rope import hunyuan_rope_index

    config = _pair()[0].config
    batch = _inputs(config, rows, "left" if left else "right", seed)
    if edits:
        batch = edited_first_row(batch, edits)
    names = ("input_ids", "mm_token_type_ids", "image_grid_thw")
    check_host_index_is_stocks(hunyuan_rope_index, config, batch, names, masked, bool(edits))


@pytest.mark.parametrize("preset", ["hunyuan-vl-tiny", pytest.param("hy-v4-vl-tiny", marks=pytest.mark.skipif(
    importlib.util.find_spec("transformers.models.hy_v4_vl") is None, reason="HY-V4-VL is not in this Transformers"))])
def test_the_stream_operators_are_stocks_loops_with_their_gradients(preset):
    """In a traced stream forward the tower's two per-item loops (the position resampling, the merger) are operators
    over the host grid (``families/hunyuan/stream.py``; HY-V4-VL's tower is HunYuan-VL's, its merger without the
    projection and begin/end embeddings): they pass ``opcheck``, give stock's loop's values and the gradients eager
    autograd gives through it, the merger's parameters included (``torch.equal``)."""
    from syncfree.families.hunyuan import stream
    from syncfree.presets import build_model

    tower = build_model(preset).model.vision_tower
    embed, merger = tower.embeddings, tower.patch_merger
    gen = torch.Generator().manual_seed(0)
    for p in merger.parameters():  # (the tiny model leaves the embeddings empty: values for the check)
        p.data.copy_(torch.randn(p.shape, generator=gen))
    grid = torch.tensor([[1, 4, 6], [1, 2, 2]] + ([[2, 4, 4]] if preset.startswith("hy-") else []))
    rows = grid.tolist()
    patches = int(grid.prod(-1).sum())

    embeddings = torch.randn(patches, embed.embed_dim, generator=gen)
    table = embed.position_embedding.weight
    args = (table, grid, class_path(type(embed)), embed.position_edge, embed.config.interpolate_mode,
            embeddings.dtype, embeddings)
    torch.library.opcheck(stream._positions_op, args)
    want = torch.concat([embed.interpolate_pos_encoding(embeddings, h, w).squeeze(0).repeat(t, 1) for t, h, w in rows])
    got = stream._positions_op(*args)
    assert torch.equal(got, want)
    g = torch.randn(want.shape, generator=gen)
    assert torch.equal(*(torch.autograd.grad(out, table, g)[0] for out in (got, want)))

    params, *rest = stream._merger_arguments(merger)
    hidden = torch.randn(1, patches, tower.config.hidden_size, generator=gen, requires_grad=True)
    merge = merger.spatial_merge_size
    begin_end = 2 if hasattr(merger, "image_begin") else 0
    features = sum(t * (h // merge) * (w // merge + 1) + begin_end for t, h, w in rows)
    args = (hidden, params, grid, *rest, torch.empty(features, 0))
    torch.library.opcheck(stream._merged_op, args)
    got = stream._merged_op(*args)
    want = torch.cat([merger(item, size=(h, w)) for (_, h, w), item in
                      zip(rows, torch.split(hidden, grid.prod(-1).tolist(), dim=1))], dim=1)
    assert torch.equal(got, want)
    g = torch.randn(want.shape, generator=gen)
    leaves = [hidden, *params]
    assert len(params) == len([p for p in merger.parameters() if p is not getattr(merger, "image_sep", None)])
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(want, leaves, g)))
