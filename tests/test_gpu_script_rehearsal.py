"""The GPU script's vision-backends step, rehearsed on the CPU (tiny model, small inputs), so the one
device session does not find its bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_vision_backends_rehearsal_fills_every_cell(tmp_path):
    out = tmp_path / "vision_backends.json"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu", "vision_backends.py"),
                             "--device", "cpu", "--model", "qwen3-vl-tiny", "--dtype", "float32", "--quick",
                             "--repeats", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    cells = {(c["scenario"], c["variant"]) for c in data["cells"]}
    scenarios = {"image-448", "images-8x224", "video-32x448"}
    assert cells == {(s, v) for s in scenarios for v in ("stock", "split", "grouped", "buckets")}
    assert all(c["latency_ms"] > 0 for c in data["cells"]) and data["errors"] == []
    assert sorted(n.split("/")[0] for n in data["not_run"]) == sorted(scenarios)  # varlen: CUDA only


def _cell(script: str = "benchmarks/packing.py") -> list[str]:
    """The arguments benchmarks/gpu/run.sh gives ``script`` (its step)."""
    import shlex

    with open(os.path.join(ROOT, "benchmarks", "gpu", "run.sh")) as f:
        text = f.read().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if script in line and not line.lstrip().startswith("#"))
    words = shlex.split(line.split("||")[0])
    return words[words.index(script) + 1:]


def _packing_cell() -> list[str]:
    return _cell()


_ON_THE_CPU = ["--device", "cpu", "--dtype", "float32", "--model", "qwen3-vl-tiny", "--steps", "1", "--repeats", "1",
               "--deadline", "300"]


@pytest.mark.slow
def test_packing_rehearsal_runs_the_scripts_own_step(tmp_path):
    """The GPU script's packed-batches step with its own arguments, on the CPU (a tiny model, one timed group): flash
    attention is passed over with its reason (no flash-attn here) and SDPA measured, stock padded against packed."""
    cell = _packing_cell()
    assert cell[cell.index("--device") + 1] == "cuda" and "--deadline" in cell and "--out" in cell
    out = tmp_path / "packing-gpu.json"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "packing.py"), *cell, *_ON_THE_CPU,
                             "--out", str(out)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["attn"] == "sdpa" and data["errors"] == [] and data["not_run"] == []
    assert [p["attn"] for p in data["attn_passed_over"]] == ["flash_attention_2"]
    assert [r["warm_up"] for r in data["rows"]] == [True, False] and data["timed_groups"] == 1
    assert data["padding_fraction"]["packed"] < data["padding_fraction"]["padded"]
    assert all(data["tokens_per_s"][v][k] > 0 for v in ("padded", "packed") for k in ("forward", "train"))


def _packing_main(argv: list[str], monkeypatch) -> int:
    import importlib.util

    spec = importlib.util.spec_from_file_location("packing_benchmark", os.path.join(ROOT, "benchmarks", "packing.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["packing.py", *argv])
    return module.main()


def _broken_attention(*args, **kwargs):
    raise RuntimeError("a stand-in attention that fails")


@pytest.mark.slow
def test_packing_falls_back_past_an_attention_that_fails_and_keeps_what_a_deadline_left(tmp_path, monkeypatch):
    """An implementation that builds but fails its warm-up group is recorded (an error, the exit status 1) and the
    next one is measured; a deadline already past starts nothing and says so."""
    from transformers import AttentionInterface

    AttentionInterface.register("syncfree_broken", _broken_attention)
    out = tmp_path / "packing.json"
    assert _packing_main([*_ON_THE_CPU, "--attn", "syncfree_broken", "sdpa", "--out", str(out)], monkeypatch) == 1
    data = json.loads(out.read_text())
    assert data["attn"] == "sdpa" and [r["step"] for r in data["rows"]] == [0, 1]
    assert [(e["attn"], e["step"]) for e in data["errors"]] == [("syncfree_broken", 0)]
    assert "a stand-in attention that fails" in data["errors"][0]["error"]
    assert [p["attn"] for p in data["attn_passed_over"]] == ["syncfree_broken"]
    late = tmp_path / "late.json"
    assert _packing_main([*_ON_THE_CPU, "--deadline", "0", "--out", str(late)], monkeypatch) == 1
    data = json.loads(late.read_text())
    assert data["rows"] == [] and data["not_run"] == ["attn sdpa"]


@pytest.mark.slow
def test_compile_stream_rehearsal_runs_the_scripts_own_step_with_buckets(tmp_path):
    """The GPU script's reduce-overhead stream step with its own arguments, on the CPU (two batches, the eager
    backend): patched with buckets, patched and stock each compile and time a second pass."""
    cell = _cell("benchmarks/compile_stream.py")
    assert cell[cell.index("--device") + 1] == "cuda" and "--buckets" in cell and "--out" in cell
    out = tmp_path / "compile_stream_gpu.json"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compile_stream.py"), *cell,
                             "--device", "cpu", "--dtype", "float32", "--mode", "default", "--backend", "eager",
                             "--batches", "2", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert list(row)[-3:] == ["patched+buckets", "patched", "stock"]
    assert all(row[v]["graphs"] >= 1 and row[v]["tokens_per_s"] > 0 for v in ("patched+buckets", "patched", "stock"))
