"""`syncfree bench --quick`: the reduced matrix runs and writes well-formed results (not timings)."""

from __future__ import annotations

import csv
import json
import re

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


def test_gpu_profile_metrics_reach_the_pairs_and_the_table():
    from syncfree.bench import pairs, table

    def record(variant, busy, dtoh, syncs):
        return {"model": "m", "scenario": "s", "scope": "vision", "attn": "sdpa", "compiled": False,
                "device": "cuda", "variant": variant, "latency_ms": 2.0 if variant == "stock" else 1.0,
                "syncs": syncs, "peak_memory_mb": 10.0,
                "gpu": {"kernel_ms": 0.5, "busy_fraction": busy, "memcpy_htod": 3, "memcpy_dtoh": dtoh,
                        "stream_syncs": dtoh}}

    [row] = pairs([record("stock", 0.25, 40, 40), record("patched", 0.75, 0, 0)])
    assert (row["stock_busy_fraction"], row["patched_busy_fraction"]) == (0.25, 0.75)
    assert (row["stock_memcpy_dtoh"], row["patched_memcpy_dtoh"], row["patched_peak_memory_mb"]) == (40, 0, 10.0)
    head, _, line = table([row]).splitlines()
    assert re.split(r"\s{2,}", head)[-3:] == ["busy s/p", "DtoH s/p", "stream syncs s/p"]
    assert line.split()[-3:] == ["0.25/0.75", "40/0", "40/0"]
    assert "busy" not in table(pairs([{**record("stock", 0, 0, 1), "gpu": {}},
                                      {**record("patched", 0, 0, 0), "gpu": {}}]))
