"""`syncfree bench --quick`: the reduced matrix runs and writes well-formed results (not timings)."""

from __future__ import annotations

import csv
import json

import pytest

from syncfree.bench import QUICK_MODELS, SCENARIOS
from syncfree.bench.gpu_metrics import busy_time
from syncfree.cli import main


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert main(["bench", "--quick", "--device", "cpu", "--out", str(out), "--name", "quick", "--no-plot"]) == 0
    return json.loads((out / "quick.json").read_text()), list(csv.DictReader(open(out / "quick.csv")))


def test_quick_matrix_covers_every_scenario_model_and_scope(quick):
    data, rows = quick
    cells = {(p["model"], p["scenario"], p["scope"]) for p in data["pairs"]}
    assert cells == {(m, s, scope) for m in QUICK_MODELS for s in SCENARIOS for scope in ("vision", "full")}
    assert len(data["records"]) == 2 * len(data["pairs"]) and len(rows) == len(data["pairs"])
    assert {"torch", "transformers", "cpus"} <= data["machine"].keys() and data["timestamp"].endswith("Z")


def test_quick_results_have_latencies_and_ratios_from_the_same_run(quick):
    data, _ = quick
    for p in data["pairs"]:
        assert p["stock_ms"] > 0 and p["patched_ms"] > 0
        assert p["ratio"] == pytest.approx(p["patched_ms"] / p["stock_ms"])
    for r in data["records"]:
        assert r["latency_min_ms"] <= r["latency_ms"] <= r["latency_max_ms"] and r["repeats"] >= 1


def test_patched_never_syncs_and_stock_always_does(quick):
    data, _ = quick
    assert all(p["patched_syncs"] == 0 for p in data["pairs"])
    assert all(p["stock_syncs"] > 0 for p in data["pairs"])
    assert all(r["blocking_copies"] == 0 for r in data["records"] if r["variant"] == "patched")


def test_patched_vision_tower_has_no_graph_breaks_where_stock_has_some(quick):
    data, _ = quick
    measured = [p for p in data["pairs"] if p["scope"] == "vision" and p["stock_graph_breaks"] is not None]
    assert measured
    assert all(p["patched_graph_breaks"] == 0 and p["stock_graph_breaks"] > 0 for p in measured)


def test_gpu_busy_time_is_the_union_of_kernel_intervals():
    assert busy_time([(0, 2), (1, 3), (5, 6), (5.5, 5.8)]) == 4
    assert busy_time([]) == 0


def test_gpu_profile_counts_only_device_activity(monkeypatch):
    # On a machine without CUDA the profiler sees host ops only: none may count as a kernel, a copy or a sync.
    import torch

    from syncfree.bench.gpu_metrics import profile_forward

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    a = torch.ones(128, 128)
    got = profile_forward(lambda: (a @ a).sum().item())
    assert got["wall_ms"] > 0
    assert (got["kernel_ms"], got["busy_fraction"]) == (0, 0)
    assert (got["memcpy_htod"], got["memcpy_dtoh"], got["stream_syncs"]) == (0, 0, 0)
