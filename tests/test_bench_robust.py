"""`syncfree bench` survives what a time-boxed GPU run meets: a deadline, a failing scenario, being stopped."""

from __future__ import annotations

import json

import pytest

import syncfree.bench.runner as runner
from syncfree.cli import main

# Tiny model, vision scope, no graph-break count: a few seconds per scenario.
ARGS = ["bench", "--quick", "--device", "cpu", "--models", "qwen3-vl-tiny", "--scopes", "vision",
        "--scenarios", "image-448", "images-8x224", "--no-graph-breaks", "--no-plot", "--name", "r"]


def _result(out) -> dict:
    return json.loads((out / "r.json").read_text())


def test_deadline_stops_new_scenarios_and_lists_them_as_not_run(tmp_path, monkeypatch, capsys):
    # The clock reads 0 until the first scenario has started, then far past the deadline.
    ticks = iter([0.0, 0.0, 0.0])
    monkeypatch.setattr(runner, "_clock", lambda: next(ticks, 1e6))
    assert main(ARGS + ["--out", str(tmp_path), "--deadline", "60"]) == 0
    data = _result(tmp_path)
    assert {p["scenario"] for p in data["pairs"]} == {"image-448"}
    assert data["not_run"] == [{"model": "qwen3-vl-tiny", "attn": "sdpa", "scenario": "images-8x224"}]
    assert "not run (past the 60 s deadline): qwen3-vl-tiny/sdpa/images-8x224" in capsys.readouterr().out


def _fail_on(scenario_name):
    real = runner._scenario

    def scenario(model, model_name, attn, name, *args):
        if name == scenario_name:
            raise RuntimeError(f"boom in {name}")
        return real(model, model_name, attn, name, *args)

    return scenario


def test_keep_going_records_the_failure_and_runs_the_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "_scenario", _fail_on("image-448"))
    assert main(ARGS + ["--out", str(tmp_path), "--keep-going"]) == 1  # failures show in the exit status
    data = _result(tmp_path)
    assert {p["scenario"] for p in data["pairs"]} == {"images-8x224"}
    [error] = data["errors"]
    assert (error["scenario"], error["error"]) == ("image-448", "RuntimeError: boom in image-448")
    assert "boom in image-448" in error["traceback"]
    assert "FAILED qwen3-vl-tiny sdpa image-448: RuntimeError: boom in image-448" in capsys.readouterr().out


def test_without_keep_going_a_failure_stops_the_run_but_what_was_measured_is_on_disk(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "_scenario", _fail_on("images-8x224"))
    monkeypatch.delenv("SYNCFREE_DEBUG", raising=False)
    assert main(ARGS + ["--out", str(tmp_path)]) == 1  # syncfree's own failure: one line, exit status 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("syncfree bench: error: internal error: RuntimeError: boom in images-8x224")
    with pytest.raises(RuntimeError, match="boom in images-8x224"):  # --debug: the exception itself
        main(ARGS + ["--out", str(tmp_path / "again"), "--debug"])
    data = _result(tmp_path)  # written after the first scenario, before the second failed
    assert {p["scenario"] for p in data["pairs"]} == {"image-448"}
    assert all(p["patched_syncs"] == 0 for p in data["pairs"])


def test_preset_models_are_drawn_on_the_device_they_are_built_for():
    # The GPU bench builds 8B shapes on the device: nothing may be initialized on the host first.
    from syncfree.presets import build_model

    model = build_model("qwen3-vl-tiny", device="meta")
    assert {t.device.type for t in (*model.parameters(), *model.buffers())} == {"meta"}
