"""The ``syncfree`` command line."""

from __future__ import annotations

import io
import json
import re

import pytest

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
                rows[label] = [int(x) for x in line.split()[-6:]]  # syncs, blocking, h2d, d2h, lines, launches
    return rows


def test_demo_prints_stock_and_patched_side_by_side(capsys):
    assert main(["demo", "--model", "qwen3-vl-tiny", "--inputs", "mixed"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("syncfree demo: qwen3-vl-tiny, mixed inputs")
    assert re.search(r"^3 audited forwards in \d+\.\d s \(model built and moved in \d+\.\d s\)$", out, re.M)
    assert "\r" not in out  # no progress display where stdout and stderr are not terminals
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
    err = capsys.readouterr().err.strip()
    assert "unknown model 'no-such-model'" in err and "syncfree presets" in err
    assert "\n" not in err and len(err) <= 300, err  # one short line, not every preset
    assert main(["audit", "--model", "qwen3-vl-8"]) == 2
    assert "did you mean 'qwen3-vl-8b'?" in capsys.readouterr().err


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


@pytest.mark.slow
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


# ---- progress ------------------------------------------------------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_redraws_one_line_on_a_terminal_and_is_silent_elsewhere():
    from syncfree.compare.progress import ProgressLine

    pipe, tty = io.StringIO(), _Terminal()
    shown = ["[1/3 stock] vision block 1/24", "[1/3 stock] vision block 2/24"]
    for stream in (pipe, tty):
        line = ProgressLine(stream)
        assert line.enabled == (stream is tty)
        for text in shown:
            before = len(stream.getvalue())
            line.show(text)
            if stream is tty:
                assert text in tty.getvalue()[before:]  # each text reaches the terminal as it is shown
                assert _screen(tty.getvalue()) == [text]  # one line, redrawn in place
        line.clear()
    assert pipe.getvalue() == ""  # nothing at all where the stream is not a terminal
    assert _screen(tty.getvalue()) == [""]  # clear() leaves the line erased


def _screen(written: str) -> list[str]:
    """What a terminal shows after ``written``: carriage returns, line feeds, cursor up and erase-line
    (the codes a one-line live display uses); other escape sequences (cursor show/hide) draw nothing."""
    rows, row, col = [""], 0, 0
    for match in re.finditer(r"\x1b\[([0-9;?]*)([A-Za-z])|(.)", written, re.S):
        args, code, char = match.groups()
        if char == "\r":
            col = 0
        elif char == "\n":
            row, col = row + 1, 0
            rows += [""] * (row + 1 - len(rows))
        elif char is not None:
            rows[row] = rows[row][:col].ljust(col) + char + rows[row][col + 1:]
            col += 1
        elif code == "A":
            row = max(0, row - int(args or 1))
        elif code == "K":  # 2K: the whole line; K or 0K: from the cursor on
            rows[row] = "" if args == "2" else rows[row][:col]
    while len(rows) > 1 and not rows[-1]:
        rows.pop()
    return [r.rstrip() for r in rows]


def test_step_progress_draws_a_bar_on_a_terminal_and_plain_lines_elsewhere(capsys):
    from syncfree.display import step_progress

    tty = _Terminal()
    with step_progress(2, stream=tty) as step:
        step("[1/2] qwen3_vl")
        step("[2/2] glm4v")
    assert "[2/2] glm4v" in _screen(tty.getvalue())[-1] and capsys.readouterr().out == ""
    pipe = io.StringIO()
    with step_progress(2, stream=pipe, indent="  ") as step:
        step("[1/2] qwen3_vl")
        step("[2/2] glm4v")
    assert pipe.getvalue() == "" and capsys.readouterr().out == "  [1/2] qwen3_vl\n  [2/2] glm4v\n"


# ---- tables --------------------------------------------------------------------------------------------
def test_text_table_aligns_columns_under_one_header_rule_and_takes_cells_literally():
    from syncfree.display import text_table

    text = text_table(("", "syncs", "code"), [("stock", "208", "x[mask].item()"), ("patched+prepare", "0", ":x:")],
                      align="lrl")
    assert text.splitlines() == ["                 syncs  code",
                                 "--------------------------------------",
                                 "stock              208  x[mask].item()",
                                 "patched+prepare      0  :x:"]
    assert text_table(None, [("a", "1"), ("bb", "22")]) == "a    1\nbb  22"  # (first column left, others right)
    with pytest.raises(ValueError, match="one letter per column"):
        text_table(("a", "b"), [], align="l")


def test_audited_forwards_report_each_vision_block_and_text_layer_and_leave_no_hooks():
    from syncfree.compare.forward import AuditSpec, run_compare
    from syncfree.compare.progress import layer_progress

    seen: list[str] = []
    reports, about = run_compare(AuditSpec(inputs="image", scope="full", text_layers=2), progress=seen.append)
    depth = load_config("qwen3-vl-tiny").vision_config.depth
    for i, variant in enumerate(("stock", "patched", "patched+prepare"), 1):
        label = f"[{i}/3 {variant}]"
        assert [s for s in seen if s.startswith(label + " ")] == (
            [f"{label} vision block {b}/{depth}" for b in range(1, depth + 1)]
            + [f"{label} text layer {n}/2" for n in (1, 2)])
    assert about["forwards_s"] > 0 and about["build_s"] > 0
    assert reports["patched+prepare"].summary()["syncs"] == 0  # the hooks add no sync of their own

    import torch

    layer = torch.nn.Linear(2, 2)
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([layer])
    with layer_progress(model, "[x]", seen.append):
        model.blocks[0](torch.ones(2))
    assert seen[-1] == "[x] vision block 1/1" and not layer._forward_pre_hooks  # removed on exit


def test_audit_compare_for_an_omni_thinker_with_a_videos_audio_track(tmp_path):
    path = tmp_path / "omni.json"
    assert main(["audit", "--compare", "--model", "qwen2.5-omni-tiny", "--inputs", "audio-in-video",
                 "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["stock"]["summary"]["syncs"] > 20
    assert data["patched"]["summary"]["syncs"] == 1 and data["patched+prepare"]["summary"]["syncs"] == 0


def test_audio_inputs_for_a_model_without_audio_are_a_clear_error(capsys):
    assert main(["audit", "--model", "qwen3-vl-tiny", "--inputs", "audio"]) == 2
    assert "--inputs audio needs an Omni thinker" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["exaone4.5-tiny", "glm4.1v-tiny", "glm-ocr-tiny", "cosmos3-edge-tiny",
                                    "paddleocr-vl-tiny", "ernie4.5-vl-tiny"])
def test_audit_compare_for_the_families_beyond_qwen(preset, tmp_path):
    """Every command path (the batch, the report's vision depth, the three variants) for a family whose config or
    pixels are not Qwen's: SigLIP-style configs name their depth num_hidden_layers; ERNIE-4.5-VL's tower is
    ``vision_tower`` and its MoE runs in bf16 (where the experts' grouped matmul reads nothing on the host)."""
    path = tmp_path / "audit.json"
    dtype = ["--dtype", "bf16"] if preset.startswith("ernie") else []
    assert main(["audit", "--compare", "--model", preset, "--inputs", "images", "--json", str(path), *dtype]) == 0
    data = json.loads(path.read_text())
    assert data["run"]["vision_depth"] == (4 if preset == "exaone4.5-tiny" else 2)
    assert data["stock"]["summary"]["syncs"] > data["patched"]["summary"]["syncs"] == 1
    assert (data["patched+prepare"]["summary"]["syncs"], data["patched+prepare"]["summary"]["blocking_copies"]) == (0, 0)


@pytest.mark.parametrize("preset", ["paddleocr-vl-tiny", "glm4.1v-tiny"])
def test_audit_of_a_tower_alone_hands_it_what_its_model_would(preset, tmp_path):
    """--scope vision calls the tower as its model's get_*_features does: PaddleOCR-VL's (1, patches, C, P, P) pixels
    (4D ones failed), GLM-4.1V's video frames as (1, h, w) rows."""
    path = tmp_path / "audit.json"
    inputs = "images" if preset.startswith("paddle") else "video"
    assert main(["audit", "--compare", "--model", preset, "--scope", "vision", "--inputs", inputs,
                 "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["stock"]["summary"]["syncs"] > 0
    assert (data["patched+prepare"]["summary"]["syncs"], data["patched+prepare"]["summary"]["blocking_copies"]) == (0, 0)


def test_the_option_names_are_their_registries():
    """The command line offers its names as literals (its help must not import torch); they are the registries'."""
    from syncfree.cli.names import INPUT_KINDS, VISION_BACKENDS
    from syncfree.inputs import LAYOUT_NAMES, OMNI_LAYOUT_NAMES
    from syncfree.rewrite.attention import BACKENDS

    assert INPUT_KINDS == tuple(dict.fromkeys(LAYOUT_NAMES + OMNI_LAYOUT_NAMES))
    assert VISION_BACKENDS == BACKENDS


@pytest.mark.parametrize("command", ["", "demo", "audit", "bench", "census", "patch", "doctor", "presets"])
def test_help_imports_neither_torch_nor_transformers(command):
    """``syncfree --help`` and ``syncfree COMMAND --help``, as ``python -X importtime`` lists the imports."""
    import subprocess
    import sys

    argv = ["syncfree", *command.split(), "--help"]
    code = f"import sys; sys.argv = {argv!r}; from syncfree.cli import main; main()"
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "usage: syncfree" in run.stdout, run.stderr[-500:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "transformers", "numpy"}, sorted(imported & {"torch", "transformers", "numpy"})


def test_presets_lists_every_preset(capsys):
    from syncfree.presets import PRESETS

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in PRESETS)
    assert main(["presets", "--tiny"]) == 0
    tiny = capsys.readouterr().out
    assert "qwen3-vl-tiny" in tiny and "qwen3-vl-8b" not in tiny
