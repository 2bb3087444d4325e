"""docs/benchmarks.md's conformance tables: published model shapes audited, and Transformers' own model tests."""

from __future__ import annotations

import glob
import os
import re

from . import common
from .census import census_rows
from .common import bold_zero, display_name, load, table, versions_note

__all__ = ["render_hf_tests", "render_published_shapes"]


def _dtype(name: str, doc: dict) -> str:
    command = doc.get("command") or ""
    return "bf16" if "bf16" in name or "bfloat16" in command else "fp32"


def render_published_shapes() -> str:
    rows = []
    for path in sorted(glob.glob(os.path.join(common.RESULTS, "audit-*.json"))):
        name = os.path.basename(path)
        doc = load(name)
        run = doc["run"]
        grids = "; ".join(f"{k.split('_')[0]}s {' '.join('×'.join(map(str, g)) for g in v)}"
                          for k, v in run["grids"].items())
        s = {v: doc[v]["summary"] for v in run["variants"]}
        rows.append((f"`{run['model']}`", run["vision_depth"], run["inputs"], _dtype(name, doc), grids,
                     f"{s['stock']['syncs']} ({s['stock']['blocking_copies']})", s["patched"]["syncs"],
                     bold_zero(s["patched+prepare"]["syncs"])))
    head = ("preset", "vision blocks", "inputs", "dtype", "grids (t×h×w)", "stock syncs (blocking copies)", "patched",
            "patched + `prepare`")
    return (table(head, rows, "lrlllrrr") + "\nRecorded in `benchmarks/results/audit-*.json` by `syncfree audit "
            "--compare --model PRESET --inputs KIND --text-layers 2 [--dtype bfloat16] [--image-side N] --json PATH`"
            + versions_note("audit-*.json") + ".\n")


def render_hf_tests() -> str:
    """Transformers' own model tests, stock vs patched, from the table in hf-tests.md."""
    with open(os.path.join(common.RESULTS, "hf-tests.md")) as f:
        newest = re.split(r"^# ", f.read(), flags=re.M)[1]  # (the file's records, newest first: the newest one)
    first, *later = re.split(r"^## Transformers (?=\d)", newest, flags=re.M)
    row = r"^\| (\w+) \| ([\d/]+[^|]*) \| ([\d/]+[^|]*) \| (\d+) \|$"
    found = re.findall(row, first, re.M)
    rows = [(f"{display_name(t)} (`{t}`)", stock.strip(), patched.strip(), n) for t, stock, patched, n in found]
    differ = sum(int(n) for *_, n in found)
    ran = {t for t, *_ in found}
    others = [display_name(r["family"]) for r in census_rows() if r["support"] == "full" and r["family"] not in ran]
    missing = f"\nNot run this way: {', '.join(others)}.\n" if others else ""
    releases = []
    for section in later:  # (a later release's re-runs of the families whose code it changed)
        version, body = section.split(None, 1)
        rerun = re.findall(row, body, re.M)
        releases.append(f"On Transformers {version}, the {len(rerun)} families whose code it changed and that have "
                        f"tests there ({', '.join(display_name(t) for t, *_ in rerun)}): "
                        f"**{sum(int(n) for *_, n in rerun)} tests differ**.\n")
    return (f"{len(rows)} families, **{differ} tests differ**. Counts are passed/failed/skipped; every failure fails "
            "in stock the same way.\n\n"
            + table(("family", "stock", "patched", "tests that differ"), rows, "lllr") + missing
            + "".join("\n" + line for line in releases))
