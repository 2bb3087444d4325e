"""``syncfree census``: the command, its table, and the JSON and CSV files."""

from __future__ import annotations

import argparse
import csv
import json
import os
import time

from ..compare.outputs import census_out
from ..display import step_progress, text_table
from .plot import plot_census
from .run import CensusRow, as_dicts, discover, run_census

__all__ = ["run_census_command", "table", "default_out"]


def default_out() -> str:
    return census_out()


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)


def _pair(stock, patched) -> str:
    return "-" if stock is None else f"{stock} -> {_cell(patched)}"


def table(rows: list[CensusRow]) -> str:
    head = ("family", "support", "stock syncs", "stock blocking", "patched syncs", "patched+prepare", "same outputs",
            "launches", "graph breaks", "host ms", "note")
    lines = []
    for r in rows:
        note = r.reason if r.status != "ok" or r.support == "changed" else (f"left: {r.left}" if r.left else "")
        lines.append((r.family, r.support if r.status == "ok" else f"{r.support} ({r.status})", _cell(r.stock_syncs),
                      _cell(r.stock_blocking), _cell(r.patched_syncs), _cell(r.prepared_syncs),
                      _cell(r.same_outputs), _pair(r.stock_launches, r.patched_launches),
                      _pair(r.stock_breaks, r.patched_breaks), _pair(r.stock_ms, r.patched_ms), note[:100]))
    return text_table(head, lines, align="ll" + "rrrr" + "l" * 5)  # the sync counts right-aligned


def summary(rows: list[CensusRow]) -> str:
    counts = {level: sum(r.support == level for r in rows) for level in ("full", "generic", "none", "changed")}
    ran = sum(r.status == "ok" for r in rows)
    changed = (f", {counts['changed']} left stock (this release changed their code: `syncfree doctor`)"
               if counts["changed"] else "")
    return (f"{len(rows)} families with the packed vision split: {counts['full']} fully supported, "
            f"{counts['generic']} with the generic fix, {counts['none']} not supported{changed}; {ran} built and ran "
            "here")


def run_census_command(args: argparse.Namespace) -> int:
    from ..compare.checks import check_out_dir

    out = args.out or default_out()
    check_out_dir(out)
    families = args.families or discover()
    unknown = [f for f in families if f not in discover()]
    if unknown:
        raise ValueError(f"--families {' '.join(unknown)}: no such family with the packed vision split in the "
                         "installed Transformers (run without --families to list them)")
    print(f"syncfree census: {len(families)} families, stock vs patched, one forward each on the emulated device; "
          f"results go to {out}", flush=True)
    start = time.perf_counter()
    # (--debug: each failing family's traceback too, not only its one-line reason.)
    debug = bool(getattr(args, "debug", False)) or os.environ.get("SYNCFREE_DEBUG", "").strip().lower() not in (
        "", "0", "false", "no", "off")
    # (a bar on a terminal; elsewhere the plain "  [3/12] glm4v" line of each family as it starts)
    with step_progress(len(families), indent="  ") as step:
        rows = run_census(families, progress=step, debug=debug,
                          graph_breaks=not getattr(args, "no_graph_breaks", False))
    import torch
    import transformers

    result = {"transformers": transformers.__version__, "torch": torch.__version__,
              "seconds": round(time.perf_counter() - start, 1), "rows": as_dicts(rows)}
    paths = [os.path.join(out, f"{args.name}.json"), os.path.join(out, f"{args.name}.csv")]
    with open(paths[0], "w") as f:
        json.dump(result, f, indent=2)
    with open(paths[1], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(result["rows"][0]) if rows else ["family"])
        writer.writeheader()
        writer.writerows({k: "; ".join(v) if isinstance(v, list) else v for k, v in row.items()}
                         for row in result["rows"])
    png = plot_census(rows, os.path.join(out, f"{args.name}.png"),
                      f"torch {torch.__version__}, transformers {transformers.__version__}")
    print("\n" + table(rows) + "\n\n" + summary(rows) + f" ({result['seconds']} s)")
    print("wrote " + ", ".join(paths + ([png] if png else [])))
    if png is None and rows:
        print('no PNG plot written: matplotlib is not installed (pip install "syncfree[bench]", or pip install '
              "matplotlib)")
    return 0
