"""The ``syncfree`` command line."""

from __future__ import annotations

import json

from syncfree.cli import main
from syncfree.presets import load_config


def test_audit_vision_scope_writes_the_report_as_json(tmp_path, capsys):
    path = tmp_path / "report.json"
    assert main(["audit", "--scope", "vision", "--inputs", "image", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    depth = load_config("qwen3-vl-tiny").vision_config.depth
    assert data["run"]["scope"] == "vision" and data["run"]["engine"] == "emulated"
    split = [s for s in data["lines"] if "lengths.tolist()" in s["code"]]
    assert [s["syncs"] for s in split] == [3 * depth]
    assert data["summary"]["syncs"] == sum(s["syncs"] for s in data["lines"])
    out = capsys.readouterr().out
    assert "lengths.tolist()" in out and "total (emulated)" in out


def test_audit_rope_scope_only_sees_the_rope_index(tmp_path):
    path = tmp_path / "rope.json"
    assert main(["audit", "--scope", "rope", "--inputs", "video", "--json", str(path)]) == 0
    events = json.loads(path.read_text())["events"]
    assert events and all(any("get_rope_index" in frame for frame in e["stack"]) for e in events)


def test_demo_prints_the_stock_table(capsys):
    assert main(["demo", "--model", "qwen3-vl-tiny", "--inputs", "image"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("syncfree demo (stock Transformers): qwen3-vl-tiny")
    assert "get_rope_index" in out and "total (emulated)" in out


def test_unknown_model_is_a_clear_error(capsys):
    assert main(["audit", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'no-such-model'" in err and "qwen3-vl-8b" in err
