"""HY-V4-VL: HunYuan-VL's tower (a newline column per merged row, no begin/end embeddings), images and videos with no
markers around them, its own rotary index (every frame a block of max(lh, lw + 1) positions) run as stock on the host,
before an MLA + indexer, MoE, hyper-connection text model. Parity with stock over the processor's layouts, the plan's
positions against the family's stock index, no syncs and no blocking copies with prepare() (bf16), generate (dynamic,
static and beams), gradients, compile."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_host_index_is_stocks,
    check_prepared_prefill_is_sync_and_copy_free,
    edited_first_row,
    first_row_edit_cases,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.inputs import Image, Text, Video, processor_batch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers.models.hy_v4_vl") is None,
                                reason="this Transformers release has no HY-V4-VL")
NAME = "hy-v4-vl-tiny"


def _pair(attn: str = "sdpa", dtype=torch.float32):
    return model_pair(NAME, attn, dtype)


def _inputs(config, samples, padding_side="left", seed=0):
    from syncfree.families.hunyuan import build_hyv4_inputs

    return build_hyv4_inputs(config, samples, padding_side=padding_side, seed=seed)


# Pixels are multiples of 32 (patch 16 x merge 2).
U = 32
LAYOUTS = standard_layouts(U)


def test_the_processor_layout():
    """An image is lh * (lw + 1) image placeholders typed 1, a video one run of t * lh * (lw + 1) video placeholders
    typed 2 (HYV4VLProcessor), nothing around them; pixels are one row per patch and frame."""
    config = _pair()[0].config
    batch = processor_batch(config, [[Text(2), Image(2 * U, 3 * U), Text(1), Video(3, U, 2 * U), Text(2)]])
    assert set(batch) == {"input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw",
                          "pixel_values_videos", "video_grid_thw"}
    ids, types = batch["input_ids"][0].tolist(), batch["mm_token_type_ids"][0].tolist()
    image, video = 2 * (3 + 1), 3 * 1 * (2 + 1)
    assert ids[2:2 + image] == [config.image_token_id] * image and ids[2 + image] not in (config.image_token_id,
                                                                                         config.video_token_id)
    assert ids[3 + image:3 + image + video] == [config.video_token_id] * video and len(ids) == 3 + image + video + 2
    assert types == [1 if i == config.image_token_id else 2 if i == config.video_token_id else 0 for i in ids]
    assert batch["image_grid_thw"].tolist() == [[1, 4, 6]] and batch["video_grid_thw"].tolist() == [[3, 2, 4]]
    assert tuple(batch["pixel_values"].shape) == (24, 3 * 16 * 16)
    assert tuple(batch["pixel_values_videos"].shape) == (24, 3 * 16 * 16)


side = st.integers(1, 3).map(lambda n: U * n)
items = st.one_of(st.builds(Text, st.integers(1, 4)), st.builds(Image, side, side),
                  st.builds(Video, st.integers(1, 3), side, side))


def _separated(row: list) -> list:
    """Text between two images or videos: with no markers, two adjacent items of a kind are one placeholder run,
    which stock's index refuses (see the test below); the chat template always writes text between them."""
    out = []
    for item in row:
        if out and not isinstance(item, Text) and not isinstance(out[-1], Text):
            out.append(Text(1))
        out.append(item)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(items, min_size=1, max_size=4).map(_separated), min_size=1, max_size=3),
       left=st.booleans(),
       seed=st.integers(0, 2**16))
def test_the_plans_positions_are_the_familys_stock_index(rows, left, seed):
    """The plan's positions (stock's index run on the host copies), the patched index without a plan (one read, then
    the same) and on a prepared batch (its plan's) against stock's index on the batch: every axis, row and delta."""
    stock, patched = _pair()
    batch = _inputs(stock.config, rows, "left" if left else "right", seed)
    if "image_grid_thw" not in batch and "video_grid_thw" not in batch:
        return  # (a text-only batch: stock computes no multimodal positions)
    names = ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw", "attention_mask")
    args = {k: batch[k] for k in names if k in batch}
    want = stock.model.get_rope_index(**args)
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
    prepared = syncfree.prepare(batch, "cpu", patched)  # (registered: the index answers from its plan)
    for got in ((plan.position_ids, plan.rope_deltas), patched.model.get_rope_index(**args),
                patched.model.get_rope_index(**{k: prepared[k] for k in args})):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_the_placeholder_check_raises_stocks_error(kind):
    """A placeholder short: stock's ValueError and message, from the plan's count."""
    stock, patched = _pair()
    batch = _inputs(stock.config, LAYOUTS["image and videos"])
    token = getattr(stock.config, f"{kind}_token_id")
    t, h, w = batch[f"{kind}_grid_thw"][0].tolist()
    ids = batch["input_ids"]
    ids[0, (ids[0] == token).nonzero()[t * (h // 2) * (w // 2 + 1) - 1, 0]] = 7  # (the first run's last: one run still)
    batch["mm_token_type_ids"][0] = torch.where(ids[0] == 7, 0, batch["mm_token_type_ids"][0])
    errors = []
    for model in (stock, patched):
        with pytest.raises(ValueError) as raised, torch.no_grad():
            model(**batch)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and errors[0].startswith(f"{kind.capitalize()} features and {kind} tokens do not")


def test_adjacent_images_are_refused_as_stock_refuses_them():
    """Two images with nothing between them are one placeholder run: prepare() names the runs that do not match, and
    the patched forward raises stock's own error (its index, which the plan leaves to stock for such a batch)."""
    stock, patched = _pair()
    batch = _inputs(stock.config, [[Text(2), Image(U, U), Image(U, 2 * U), Text(1)]])
    with pytest.raises(ValueError, match=r"runs in the tokens have \[5\] tokens .* of \[2, 3\] tokens"):
        syncfree.prepare(batch, None, patched)
    errors = []
    for model in (stock, patched):
        with pytest.raises(RuntimeError) as raised, torch.no_grad():
            model(**batch)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and "shape mismatch" in errors[0]


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    # (bf16: the experts' grouped matmul has no host read there; in fp32 it reads its group sizes, as in every MoE.)
    stock, patched = _pair(dtype=torch.bfloat16)
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][1:])
    batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


_GRID_HELPERS = ("grid_products", "grid_list", "grid_rows", "item_patches", "listed_rows")  # (shared; the family's)


def test_the_patched_towers_graph_breaks_are_its_own_grid_reads():
    """The tower's per-image loops (the position table's resampling, the merger) run over the plan's host grid: no
    sync. The tower traced alone breaks the graph only where stock reads that grid into Python: the resampling's
    ``int(height)`` / ``int(width)`` (its explicit scale factor), the merger's ``.tolist()`` (split sizes and loop).
    (Inside a prepared forward those reads are the plan's rows: one graph, tests/test_one_graph.py.)"""
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(3 * U, 4 * U), Text(1), Image(2 * U, U)]])
    explained = tower_graph_breaks(patched, patched.model.vision_tower, batch)
    frames = [r.user_stack[-1] for r in explained.break_reasons]
    lines = [str(f.line).strip() for f in frames]
    grid_reads = ["for t, h, w in grid_thw:", "scale_h = (int(height) + 0.1) / self.position_edge",
                  "scale_w = (int(width) + 0.1) / self.position_edge", "split_sizes = grid_thw.prod(dim=-1).tolist()",
                  "for grid, item in zip(grid_thw.tolist(), split_items):"]
    # (the merger's reads are stock's expressions inside the grid helpers its edits call: the plan's rows in a traced
    # forward, stock's expression in a tower traced without its forward's plan, as here)
    assert lines and all(line in grid_reads or f.name in _GRID_HELPERS for line, f in zip(lines, frames)), lines


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**first_row_edit_cases(st.lists(st.lists(items, min_size=1, max_size=4).map(_separated), min_size=1, max_size=3)))
def test_the_numpy_index_is_stocks(rows, left, seed, masked, edits):
    """``hyv4_rope_index`` against stock's own index, as tests/test_patch_hunyuan.py checks HunYuan-VL's (random layouts,
    edited ones too), with videos among the grids."""
    from syncfree.families.hunyuan.rope import hyv4_rope_index

    config = _pair()[0].config
    batch = _inputs(config, rows, "left" if left else "right", seed)
    if edits:
        batch = edited_first_row(batch, edits)
    names = ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw")
    check_host_index_is_stocks(hyv4_rope_index, config, batch, names, masked, bool(edits))
