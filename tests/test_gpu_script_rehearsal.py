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
