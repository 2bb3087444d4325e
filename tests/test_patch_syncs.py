"""The patched forward makes no host sync (with prepare()) or exactly one (without), on the emulated device."""

from __future__ import annotations

import pytest
import torch

import syncfree
from syncfree.audit import assert_no_sync, audit, emulate_cuda
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import build_model


# The MoE model runs in bfloat16, the dtype its experts' grouped matmul has a sync-free CUDA kernel
# for (see test_moe_experts_in_float32_keep_only_the_grouped_matmul_syncs below).
@pytest.fixture(scope="module", params=[("qwen3-vl-tiny", torch.float32), ("qwen3-vl-moe-tiny", torch.bfloat16)],
                ids=["qwen3-vl-tiny", "qwen3-vl-moe-tiny"])
def pair(request):
    name, dtype = request.param
    stock = build_model(name, dtype=dtype)
    patched = syncfree.patch(build_model(name, dtype=dtype))
    return stock, patched


def _on_device(patched, fn):
    with emulate_cuda(), torch.no_grad():
        patched.to("cuda")
        try:
            return fn()
        finally:
            patched.to("cpu")


@pytest.mark.parametrize("kind", ["image", "images", "video", "mixed"])
def test_prepared_prefill_has_no_sync_and_no_blocking_copy(pair, kind):
    stock, patched = pair
    batch = build_inputs(stock.config, named_layout(kind, 64))
    with torch.no_grad():
        expected = stock(**batch).logits

    def run():
        kwargs = syncfree.prepare(batch, "cuda", patched)
        with assert_no_sync() as report:
            logits = patched(**kwargs).logits
        assert report.events == [] or all(not e.blocking for e in report.copies)
        return logits.cpu()

    assert torch.equal(_on_device(patched, run), expected)


def test_inputs_moved_by_the_user_cost_exactly_one_explicit_read(pair):
    stock, patched = pair
    batch = build_inputs(stock.config, named_layout("mixed", 64))

    def run():
        moved = {k: v.to("cuda") for k, v in batch.items()}
        with assert_no_sync(max_syncs=1) as report:
            patched(**moved)
        return report

    report = _on_device(patched, run)
    (sync,) = report.syncs
    assert sync.where.filename.endswith("syncfree/rewrite/host_read.py") and sync.api == "torch.cuda.synchronize"
    # Every read of the control tensors is a non-blocking copy waited for by that one sync.
    assert {(e.kind, e.blocking) for e in report.copies if e.kind == "d2h"} == {("d2h", False)}


def test_grids_left_on_the_host_work_and_add_no_sync(pair):
    stock, patched = pair
    batch = build_inputs(stock.config, named_layout("mixed", 64))
    with torch.no_grad():
        expected = stock(**batch).logits

    def run():
        moved = {k: (v if k.endswith("grid_thw") else v.to("cuda")) for k, v in batch.items()}
        with assert_no_sync(max_syncs=1):
            logits = patched(**moved).logits
        return logits.cpu()

    assert torch.equal(_on_device(patched, run), expected)


def test_stock_syncs_where_patched_does_not(pair):
    stock, patched = pair
    batch = build_inputs(stock.config, named_layout("mixed", 64))

    def run():
        stock.to("cuda")
        with audit() as stock_report:
            stock(**{k: v.to("cuda") for k, v in batch.items()})
        stock.to("cpu")
        with audit() as patched_report:
            patched(**syncfree.prepare(batch, "cuda", patched))
        return stock_report, patched_report

    stock_report, patched_report = _on_device(patched, run)
    assert len(stock_report.syncs) > 3 * stock.config.vision_config.depth
    assert patched_report.syncs == []


def test_patched_vision_tower_alone_has_no_sync_with_a_plan(pair):
    _, patched = pair
    batch = build_inputs(patched.config, named_layout("images", 64))
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]

    def run():
        pixels = batch["pixel_values"].pin_memory().to("cuda", non_blocking=True)
        vision_plan = plan.image.to("cuda")
        with assert_no_sync():
            patched.model.visual(pixels, grid_thw=plan.image.grid_thw, syncfree_vision_plan=vision_plan)
        return True

    assert _on_device(patched, run)


def test_moe_experts_in_float32_keep_only_the_grouped_matmul_syncs():
    # Outside bfloat16, CUDA's grouped matmul (Transformers' MoE experts) falls back to a loop that
    # copies the group offsets to the host: a sync per expert matmul that syncfree does not own.
    patched = syncfree.patch(build_model("qwen3-vl-moe-tiny"))
    batch = build_inputs(patched.config, named_layout("mixed", 64))

    def run():
        kwargs = syncfree.prepare(batch, "cuda", patched)
        with audit() as report:
            patched(**kwargs)
        return report

    report = _on_device(patched, run)
    layers = patched.config.text_config.num_hidden_layers
    assert report.syncs and {e.op for e in report.syncs} == {"aten::_grouped_mm"}
    assert len(report.syncs) == 2 * layers  # gate/up and down projections, every (sparse) layer
    assert all("transformers/integrations/moe.py" in e.line for e in report.syncs)
