"""benchmarks/compile_stream.py's record of where compile time goes (``--stages``) and of its cache setting
(``--inductor-caches``), run on the CPU with the eager backend (two batches: the plumbing, not the numbers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "compile_stream.py")


@pytest.mark.slow
@pytest.mark.parametrize("caches", ["fresh", "off"])
def test_stages_record_every_stage_and_one_time_per_compile_under_either_cache_setting(tmp_path, caches):
    out = tmp_path / "stream.json"
    result = subprocess.run([sys.executable, SCRIPT, "--families", "qwen2_vl", "--batches", "2", "--backend", "eager",
                             "--stages", "--inductor-caches", caches, "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["meta"]["inductor_caches"] == caches
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from compile_stream import STAGES
    finally:
        sys.path.pop(0)
    (row,) = doc["rows"]
    for side in ("stock", "patched"):
        found = row[side]
        assert set(found["stages_s"]) == set(STAGES)
        assert found["stages_s"]["bytecode_tracing"] > 0  # (Dynamo traced: the eager backend still traces)
        assert len(found["each_compile_s"]) >= found["graphs"] >= 1
        assert sum(found["each_compile_s"]) == pytest.approx(found["compile_s"], abs=0.01 * len(found["each_compile_s"]))
