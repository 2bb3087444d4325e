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


def _comparison_rows(out: str) -> dict:
    rows = {}
    for line in out.splitlines():
        for label in ("stock Transformers", "inputs from syncfree.prepare", "same inputs (one explicit read)"):
            if line.startswith(("stock Transformers", "syncfree.patch")) and label in line:
                rows[label] = [int(x) for x in line.split()[-5:]]
    return rows


def test_demo_prints_stock_and_patched_side_by_side(capsys):
    assert main(["demo", "--model", "qwen3-vl-tiny", "--inputs", "mixed"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("syncfree demo: qwen3-vl-tiny, mixed inputs")
    rows = _comparison_rows(out)
    assert rows["stock Transformers"][0] > 3 * load_config("qwen3-vl-tiny").vision_config.depth
    assert rows["inputs from syncfree.prepare"][:2] == [0, 0]  # syncs, blocking copies
    assert rows["same inputs (one explicit read)"][:2] == [1, 0]
    assert "get_rope_index" in out and "read_to_host_syncs_once" in out


def test_audit_compare_writes_every_variant(tmp_path):
    path = tmp_path / "compare.json"
    assert main(["audit", "--compare", "--scope", "rope", "--inputs", "mixed", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["run"]["variants"] == ["stock", "patched", "patched+prepare"]
    assert data["stock"]["summary"]["syncs"] > 0
    assert data["patched"]["summary"]["syncs"] == 0 and data["patched+prepare"]["summary"]["syncs"] == 0


def test_unknown_model_is_a_clear_error(capsys):
    assert main(["audit", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'no-such-model'" in err and "qwen3-vl-8b" in err


def test_audit_compare_for_qwen2_5_vl_window_attention(tmp_path):
    path = tmp_path / "qwen25.json"
    assert main(["audit", "--compare", "--model", "qwen2.5-vl-tiny", "--inputs", "mixed", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["run"]["model"] == "qwen2.5-vl-tiny"
    split = [s for s in data["stock"]["lines"] if "lengths.tolist()" in s["code"]]
    assert split and split[0]["syncs"] == 3 * load_config("qwen2.5-vl-tiny").vision_config.depth * 2
    assert data["patched"]["summary"]["syncs"] == 1
    assert data["patched+prepare"]["summary"] == {**data["patched+prepare"]["summary"], "syncs": 0,
                                                   "blocking_copies": 0}


def test_a_local_checkpoint_folder_is_audited_and_benchmarked_like_its_preset(tmp_path):
    # What a user with real weights does: the folder is loaded offline and takes the same code paths.
    import torch

    from syncfree.presets import build_model

    folder = tmp_path / "ckpt"
    preset = build_model("qwen3-vl-tiny")
    preset.save_pretrained(folder)
    loaded = build_model(str(folder))
    assert all(torch.equal(a, b) for a, b in zip(preset.state_dict().values(), loaded.state_dict().values()))

    reports = {}
    for model in ("qwen3-vl-tiny", str(folder)):
        path = tmp_path / "audit.json"
        assert main(["audit", "--compare", "--model", model, "--inputs", "mixed", "--json", str(path)]) == 0
        reports[model] = json.loads(path.read_text())
    by_folder, by_preset = reports[str(folder)], reports["qwen3-vl-tiny"]
    assert by_folder["stock"]["summary"] == by_preset["stock"]["summary"]
    assert by_folder["patched+prepare"]["summary"]["syncs"] == 0

    assert main(["bench", "--quick", "--device", "cpu", "--models", str(folder), "--scenarios", "image-448",
                 "--no-graph-breaks", "--no-plot", "--out", str(tmp_path), "--name", "ckpt"]) == 0
    pairs = json.loads((tmp_path / "ckpt.json").read_text())["pairs"]
    assert {(p["model"], p["scope"]) for p in pairs} == {(str(folder), "vision"), (str(folder), "full")}
    assert all(p["patched_syncs"] == 0 and p["stock_syncs"] > 0 for p in pairs)
