"""benchmarks/attention_crossover.py --quick: every cell of the quick grid measured and checked against split."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "attention_crossover.py"


@pytest.mark.slow
def test_quick_grid_writes_every_cell_with_its_output_check(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("attention_crossover", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # in-process: no second torch import (the run itself takes seconds)
    bench.main(["--quick", "--out-dir", str(tmp_path)])

    result = json.loads((tmp_path / "attention_crossover.json").read_text())
    grid = result["grid"]
    assert result["quick"] and result["machine"]["threads"] >= 1
    expected = {(s, t, n) for s in grid["shapes"] for t in grid["totals"] for n in grid["segments"]}
    cells = {(c["shape"], c["total"], c["segments"]): c for c in result["cells"]}
    assert set(cells) == expected and len(result["cells"]) == len(expected)
    for key, cell in cells.items():
        split, grouped, block = (cell["backends"][b] for b in ("split", "grouped", "block_diagonal"))
        assert split["ms"] > 0 and grouped["ms"] > 0 and block["ms"] > 0, key
        # each backend made its own calls (not a fallback to split measured under its name)
        assert (split["calls"], grouped["calls"], block["calls"], block["masked_calls"]) == (key[2], 1, 1, 1), key
        assert grouped["equal_to_split"] is True, key  # grouped runs the same arithmetic per segment
        assert block["max_abs_diff_vs_split"] < 1e-4, key  # one masked call: equal to rounding
        assert cell["block_diagonal_analytic_mib"] > 0 and "others_cores" in cell
    assert "| shape | total x segments |" in capsys.readouterr().out
