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


@pytest.mark.slow
def test_quick_matrix_covers_every_scenario_model_and_scope(quick):
    data, rows = quick
    cells = {(p["model"], p["scenario"], p["scope"]) for p in data["pairs"]}
    # (The audio scenarios run only for Omni thinkers: none of the default models takes audio.)
    assert cells == {(m, s, scope) for m in QUICK_MODELS for s in SCENARIOS if not SCENARIOS[s].audio
                     for scope in ("vision", "full")}
    assert len(data["records"]) == 2 * len(data["pairs"]) and len(rows) == len(data["pairs"])
    assert {"torch", "transformers", "cpus"} <= data["machine"].keys() and data["timestamp"].endswith("Z")


@pytest.mark.slow
def test_quick_results_have_latencies_and_ratios_from_the_same_run(quick):
    data, _ = quick
    for p in data["pairs"]:
        assert p["stock_ms"] > 0 and p["patched_ms"] > 0
        assert p["ratio"] == pytest.approx(p["patched_ms"] / p["stock_ms"])
    for r in data["records"]:
        assert r["latency_min_ms"] <= r["latency_ms"] <= r["latency_max_ms"] and r["repeats"] >= 1


@pytest.mark.slow
def test_patched_never_syncs_and_stock_always_does(quick):
    data, _ = quick
    assert all(p["patched_syncs"] == 0 for p in data["pairs"])
    assert all(p["stock_syncs"] > 0 for p in data["pairs"])
    assert all(r["blocking_copies"] == 0 for r in data["records"] if r["variant"] == "patched")


@pytest.mark.slow
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


# ---- options honoured, and what the command says (the matrix itself stubbed out) -----------------------
def _records(scenario: str = "video-16x448") -> list[dict]:
    return [{"model": "qwen3-vl-tiny", "scenario": scenario, "scope": "vision", "attn": "sdpa", "compiled": False,
             "device": "cpu", "variant": v, "latency_ms": ms, "latency_min_ms": ms, "latency_max_ms": ms,
             "repeats": 1, "syncs": syncs, "blocking_copies": 0}
            for v, ms, syncs in (("stock", 2.0, 19), ("patched", 1.0, 0))]


@pytest.fixture
def stub_matrix(monkeypatch):
    """Replace the matrix run; returns the configs it was given."""
    import syncfree.bench

    seen = []

    def run_matrix(cfg, progress=None, on_update=None):
        seen.append(cfg)
        return syncfree.bench.MatrixRun(records=_records())

    monkeypatch.setattr(syncfree.bench, "run_matrix", run_matrix)
    return seen


def test_quick_takes_the_explicit_options_and_keeps_its_own_defaults_for_the_rest(tmp_path, stub_matrix):
    base = ["bench", "--quick", "--device", "cpu", "--out", str(tmp_path), "--no-plot"]
    assert main(base + ["--attn", "eager", "--dtype", "bf16", "--budget", "3", "--text-layers", "1",
                        "--repeats", "4"]) == 0
    assert main(base) == 0
    given, default = stub_matrix
    assert (given.attns, given.dtype, given.budget_s, given.text_layers, given.repeats) == (
        ("eager",), "bfloat16", 3.0, 1, 4)
    assert (default.attns, default.dtype, default.budget_s, default.text_layers, default.repeats) == (
        ("sdpa",), "float32", 1.0, 2, 2)
    assert given.models == default.models == QUICK_MODELS and given.scale == default.scale == 0.08
    assert json.loads((tmp_path / "bench-cpu-quick.json").read_text())["config"]["repeats"] == 2


def test_quick_writes_outside_the_checkout_says_where_and_that_it_is_a_smoke_test(tmp_path, monkeypatch, capsys,
                                                                                   stub_matrix):
    import os
    import tempfile

    import syncfree

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["bench", "--quick", "--device", "cpu", "--no-plot"]) == 0
    folder = tmp_path / "syncfree-bench"
    assert (folder / "bench-cpu-quick.json").exists()
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(syncfree.__file__))))
    assert not str(folder).startswith(checkout)
    out = capsys.readouterr().out
    assert "smoke test" in out and "not a measurement" in out
    assert f"results go to {folder / 'bench-cpu-quick'}.json" in out
    assert f"wrote {folder / 'bench-cpu-quick.json'}" in out


def test_uncounted_graph_breaks_show_a_dash_and_a_footnote_says_why():
    from syncfree.bench import footnotes, pairs, table

    rows = pairs(_records("video-16x448") + _records("image-448"))
    lines = table(rows).splitlines()
    video = next(line for line in lines if "video-16x448" in line)
    assert video.split()[-4:-2] == ["19/0", "-"]  # syncs, graph breaks (then launches, plan ms)
    [note] = footnotes(rows)
    assert note.startswith("breaks '-': not counted") and "scenarios without an image (video-16x448)" in note
    assert "--no-graph-breaks" in footnotes(rows, graph_breaks=False)[0]
    assert footnotes([{**r, "stock_graph_breaks": 16, "patched_graph_breaks": 0} for r in rows]) == []


def test_without_matplotlib_the_bench_says_no_png_was_written_and_how_to_get_one(tmp_path, monkeypatch, capsys,
                                                                                stub_matrix):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["bench", "--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no PNG plot written: matplotlib is not installed" in out and 'pip install "syncfree[bench]"' in out
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.slow
def test_a_training_cell_times_the_step_and_counts_its_syncs_by_phase(tmp_path):
    assert main(["bench", "--quick", "--device", "cpu", "--out", str(tmp_path), "--name", "train", "--no-plot",
                 "--scopes", "train", "--models", "qwen3-vl-tiny", "--scenarios", "image+video"]) == 0
    records = json.loads((tmp_path / "train.json").read_text())["records"]
    by_variant = {r["variant"]: r for r in records if r["scope"] == "train"}
    assert set(by_variant) == {"stock", "patched"}
    assert all(r["latency_ms"] > 0 for r in by_variant.values())
    stock, patched = by_variant["stock"]["syncs_by_phase"], by_variant["patched"]["syncs_by_phase"]
    assert stock["backward"] > 0 and sum(stock.values()) == by_variant["stock"]["syncs"]
    assert patched == {"forward": 0, "recompute": 0, "backward": 0, "optimizer": 0, "trainer": 0}


@pytest.mark.slow
def test_omni_thinkers_bench_audio_scenarios_sync_free(tmp_path):
    assert main(["bench", "--quick", "--device", "cpu", "--models", "qwen2.5-omni-tiny", "--scenarios", "audio-30s",
                 "video+audio", "--out", str(tmp_path), "--name", "omni", "--no-plot", "--repeats", "1"]) == 0
    pairs = json.loads((tmp_path / "omni.json").read_text())["pairs"]
    # An audio-only scenario has no vision-tower cell; the full prefill runs the audio encoder.
    assert {(p["scenario"], p["scope"]) for p in pairs} == {("audio-30s", "full"), ("video+audio", "vision"),
                                                             ("video+audio", "full")}
    assert all(p["patched_syncs"] == 0 and p["stock_syncs"] > 0 for p in pairs)


def test_audio_scenarios_are_refused_for_models_without_audio(capsys):
    assert main(["bench", "--quick", "--device", "cpu", "--models", "qwen3-vl-tiny", "--scenarios", "audio-30s"]) == 2
    assert "feed audio, which only an Omni thinker takes; qwen3-vl-tiny is not one" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("model", ["paddleocr-vl-tiny", "glm4.1v-tiny", "ernie4.5-vl-tiny"])
def test_families_beyond_qwen_bench_sync_free_and_skip_what_they_cannot_take(model, tmp_path, capsys):
    """PaddleOCR-VL's tower takes (1, patches, C, P, P) pixels and no video; a GLM tower takes one grid row per
    video frame, and no batch of images with videos; ERNIE-4.5-VL's tower is ``vision_tower`` and takes all three
    (in bf16, where its MoE experts read nothing on the host): each cell runs as the model's own features run it."""
    dtype = ["--dtype", "bf16"] if model.startswith("ernie") else []
    assert main(["bench", "--quick", "--device", "cpu", "--models", model, "--scenarios", "image-448", "video-16x448",
                 "image+video", "--out", str(tmp_path), "--name", "b", "--no-plot", "--repeats", "1", *dtype]) == 0
    result = json.loads((tmp_path / "b.json").read_text())
    ran = {p["scenario"] for p in result["pairs"]}
    assert ran == {"paddleocr-vl-tiny": {"image-448"}, "glm4.1v-tiny": {"image-448", "video-16x448"},
                   "ernie4.5-vl-tiny": {"image-448", "video-16x448", "image+video"}}[model]
    assert all(p["patched_syncs"] == 0 and p["stock_syncs"] > 0 for p in result["pairs"])
    assert {s["scenario"] for s in result["skipped"]} == {"image+video", "video-16x448"} - ran
    assert ("skipped" in capsys.readouterr().out) == bool(result["skipped"])


def test_a_run_without_out_never_writes_the_recorded_results():
    """Reproducing a table must not dirty the checkout: without --out a full run writes to the temp folder."""
    import os
    import tempfile
    from pathlib import Path

    from syncfree.bench.command import FULL_OUT

    recorded = Path(__file__).parents[1] / "benchmarks" / "results"
    assert not Path(os.path.abspath(FULL_OUT)).is_relative_to(recorded.parent.parent)
    assert Path(FULL_OUT).is_relative_to(tempfile.gettempdir())
