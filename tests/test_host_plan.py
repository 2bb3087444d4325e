"""The host plan costs less than the syncs it removes (issue 20): nothing per patch is made on the host or
uploaded, every piece is made once per ``prepare()``, host work runs in NumPy rather than in many tiny
PyTorch ops, and the per-patch tables made on the device are stock's numbers."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import syncfree
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.plan import vision as vision_module
from syncfree.plan import vision_tables
from syncfree.plan.batch import PLAN_KEY
from syncfree.plan.vision_tables import TowerTables, host_tables, tables_from_grid, window_seqlens
from syncfree.presets import build_model, load_config

QWEN3 = TowerTables("transformers.models.qwen3_vl.modeling_qwen3_vl", 2, 8, None, 16)
QWEN25 = TowerTables("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", 2, None, 112, 14)
QWEN2 = TowerTables("transformers.models.qwen2_vl.modeling_qwen2_vl", 2, None, None, 14)


def _uploaded(plan) -> dict:
    """Every tensor a plan moves to the device with its batch, by dotted name."""
    found = {}
    for name in plan._TENSORS:
        t = getattr(plan, name, None)
        if isinstance(t, torch.Tensor):
            found[name] = t
    for name in plan._PARTS:
        part = getattr(plan, name, None)
        if part is not None:
            found.update({f"{name}.{k}": v for k, v in _uploaded(part).items()})
    return found


@pytest.mark.parametrize("model", ["qwen3-vl-tiny", "qwen2.5-vl-tiny", "qwen2-vl-tiny"])
def test_the_plan_uploads_nothing_per_patch(model):
    config = load_config(model)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    batch = build_inputs(config, [[Text(4), Image(4 * unit, 6 * unit), Text(3), Video(8, 4 * unit, 4 * unit)]])
    plan = syncfree.prepare(batch, None, config)[PLAN_KEY]
    patches = {plan.image.num_patches, plan.video.num_patches}
    merged = {p // config.vision_config.spatial_merge_size ** 2 for p in patches}
    tokens = batch["input_ids"].shape[1]
    for name, t in _uploaded(plan).items():
        assert t.shape[0] not in patches | merged or t.shape[0] == tokens, (name, tuple(t.shape))
    # The per-patch tables are still there when the forward asks (made where the plan lives).
    assert plan.image.position_ids.shape == (plan.image.num_patches, 2)


@pytest.mark.parametrize("model", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_prepare_makes_each_vision_plan_once(model, monkeypatch):
    config = load_config(model)
    batch = build_inputs(config, [[Text(4), Image(128 if model.startswith("qwen3") else 112, 112 if
                                                  model.startswith("qwen2") else 128), Text(3)]])
    calls = []
    made = vision_module.vision_plan

    def counting(grid, spec, name="grid_thw"):
        calls.append(name)
        return made(grid, spec, name)

    for module in list(sys.modules.values()):  # wherever it was imported
        if getattr(module, "__name__", "").startswith("syncfree.") and getattr(module, "vision_plan", None) is made:
            monkeypatch.setattr(module, "vision_plan", counting)
    syncfree.prepare(batch, None, config)
    assert calls == ["image_grid_thw"]


class _TorchOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# Making host copies and views of the batch, and small tensors from Python lists: no arithmetic.
_COPIES_AND_VIEWS = {"detach", "_to_copy", "lift_fresh", "view", "unsqueeze", "alias", "clone", "copy_", "empty"}


def test_host_planning_runs_no_pytorch_arithmetic_whatever_the_images():
    """Planning work that grows with images, frames or tokens runs in NumPy: a PyTorch op costs microseconds
    of fixed overhead, and fans out over intra-op threads on a busy machine."""
    config = load_config("qwen3-vl-tiny")
    counts = {}
    for images in (1, 8):
        samples = [[Text(5)] + [x for _ in range(images) for x in (Image(64, 96), Text(2))] + [Video(8, 64, 64)]]
        batch = build_inputs(config, samples * 2)
        syncfree.prepare(batch, None, config)  # warm-up: imports, the one-time table check
        with _TorchOps() as mode:
            syncfree.prepare(batch, None, config)
        assert set(mode.ops) <= _COPIES_AND_VIEWS, sorted(set(mode.ops) - _COPIES_AND_VIEWS)
        counts[images] = len(mode.ops)
    assert counts[1] == counts[8], counts


grids = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 14).map(lambda n: 2 * n),
                           st.integers(1, 14).map(lambda n: 2 * n)), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(rows=grids)
def test_device_tables_equal_the_stock_helpers(rows):
    grid = torch.tensor(rows, dtype=torch.long)
    for spec in (QWEN3, QWEN25, QWEN2):
        ours, stock = tables_from_grid(grid, spec), host_tables(grid, spec)
        assert ours.keys() == stock.keys()
        for name, value in stock.items():
            assert ours[name].dtype == value.dtype and torch.equal(ours[name], value), (spec, name)
    from transformers.vision_utils import get_vision_window_index

    cu = get_vision_window_index(grid, spatial_merge_size=2, window_size=112, patch_size=14)[1]
    assert window_seqlens(rows, QWEN25) == (cu[1:] - cu[:-1]).tolist()


def test_tables_fall_back_to_the_stock_helpers_when_the_installed_ones_differ(monkeypatch):
    """A Transformers release whose helpers compute other numbers: the check made once per process notices,
    says so, and the plan uses stock's own helpers on the host (outputs stay stock's)."""
    stock = build_model("qwen3-vl-tiny")
    patched = syncfree.patch(build_model("qwen3-vl-tiny"))
    batch = build_inputs(stock.config, [[Text(4), Image(64, 96), Text(3)]])

    original = vision_tables.device_tables

    def shifted(items, total, spec, windows=None):  # what a changed stock helper would look like from here
        tables = original(items, total, spec, windows)
        tables["position_ids"] = tables["position_ids"] + 1
        return tables

    monkeypatch.setattr(vision_tables, "device_tables", shifted)
    vision_tables.device_tables_match_stock.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan = syncfree.prepare(batch, None, patched)[PLAN_KEY]
        assert not plan.image.tables_by_device
        assert any("differ from the ones syncfree builds" in str(w.message) for w in caught)
        with torch.no_grad():
            assert torch.equal(patched(**batch, **{PLAN_KEY: plan}).logits, stock(**batch).logits)
    finally:
        vision_tables.device_tables_match_stock.cache_clear()
