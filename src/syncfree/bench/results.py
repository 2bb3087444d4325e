"""Bench results: pairing stock with patched, the terminal table, JSON + CSV files, and the plot."""

from __future__ import annotations

import csv
import json
import os
import platform
import time

import torch

from ..display import text_table

__all__ = ["pairs", "table", "footnotes", "write_results", "machine"]

_KEY = ("model", "scenario", "scope", "attn", "compiled", "device")


def pairs(records: list[dict]) -> list[dict]:
    """One row per cell with stock and patched side by side; ratio = patched / stock latency."""
    cells: dict[tuple, dict] = {}
    for r in records:
        cells.setdefault(tuple(r[k] for k in _KEY), {})[r["variant"]] = r
    out = []
    for key, v in cells.items():
        if {"stock", "patched"} <= v.keys():
            stock, patched = v["stock"], v["patched"]
            row = {**dict(zip(_KEY, key)), "stock_ms": stock["latency_ms"], "patched_ms": patched["latency_ms"],
                   "ratio": patched["latency_ms"] / stock["latency_ms"],
                   "stock_syncs": stock.get("syncs"), "patched_syncs": patched.get("syncs"),
                   "stock_graph_breaks": stock.get("graph_breaks"),
                   "patched_graph_breaks": patched.get("graph_breaks"),
                   "stock_launches": stock.get("launches"), "patched_launches": patched.get("launches"),
                   "plan_ms": patched.get("plan_ms"), "plan_kb": patched.get("plan_kb")}
            for name, r in (("stock", stock), ("patched", patched)):  # the profiler's view, on a GPU
                for metric in _GPU_METRICS:
                    if metric in r.get("gpu", {}):
                        row[f"{name}_{metric}"] = r["gpu"][metric]
                if "peak_memory_mb" in r:
                    row[f"{name}_peak_memory_mb"] = r["peak_memory_mb"]
            out.append(row)
    return out


_GPU_METRICS = ("kernel_ms", "busy_fraction", "memcpy_htod", "memcpy_dtoh", "stream_syncs")


def _both(r: dict, key: str, fmt: str = "{}") -> str:
    """``stock/patched`` for one metric, or ``-`` where it was not measured (``footnotes`` says why)."""
    a, b = r.get(f"stock_{key}"), r.get(f"patched_{key}")
    return "-" if a is None or b is None else f"{fmt.format(a)}/{fmt.format(b)}"


def table(rows: list[dict]) -> str:
    """The terminal table; on a GPU also GPU-busy fraction, device-to-host memcpys and stream syncs."""
    gpu = any("stock_busy_fraction" in r for r in rows)
    head = ("model", "scenario", "scope", "attn", "compile", "stock ms", "patched ms", "ratio", "syncs s/p",
            "breaks s/p", "launches s/p", "plan ms") + (("busy s/p", "DtoH s/p", "stream syncs s/p") if gpu else ())
    lines = []
    for r in rows:
        line = (r["model"], r["scenario"], r["scope"], r["attn"], "yes" if r["compiled"] else "no",
                f"{r['stock_ms']:.1f}", f"{r['patched_ms']:.1f}", f"{r['ratio']:.3f}", _both(r, "syncs"),
                _both(r, "graph_breaks"), _both(r, "launches"),
                "-" if r.get("plan_ms") is None else f"{r['plan_ms']:.2f}")
        if gpu:
            line += (_both(r, "busy_fraction", "{:.2f}"), _both(r, "memcpy_dtoh"), _both(r, "stream_syncs"))
        lines.append(line)
    # The milliseconds and the ratio right-aligned; names and stock/patched pairs left.
    return text_table(head, lines, align="lllll" + "rrr" + "lll" + "r" + "lll" * gpu)


def _video_only(scenario: str) -> bool:
    from .scenarios import SCENARIOS

    known = SCENARIOS.get(scenario)
    return known is not None and not any(item[0] == "image" for request in known.requests for item in request)


def footnotes(rows: list[dict], graph_breaks: bool = True) -> list[str]:
    """Why the table shows ``-`` where it does: the rules of runner.py, for the rows that have one.

    Host syncs are audited for uncompiled forwards. Graph breaks are counted (``torch._dynamo.explain``)
    for the uncompiled vision tower on a scenario's image input, so not for the full prefill, compiled
    rows, scenarios without an image or runs with ``--no-graph-breaks``, nor where counting failed.
    """
    notes = []
    costs = [r for r in rows if r.get("plan_ms") is not None]
    if costs:
        notes.append("plan ms: the host time of syncfree.prepare() for the row's batch (minimum of 5; part of "
                     "patched ms); its plan uploads " + ", ".join(sorted({f"{r['scenario']} {r['plan_kb']:.0f} KB"
                                                                          for r in costs})))
    if any(r["compiled"] and r.get("stock_syncs") is None for r in rows):
        notes.append("syncs '-': not audited -- host syncs are audited for uncompiled forwards only")
    missing = [r for r in rows if r.get("stock_graph_breaks") is None or r.get("patched_graph_breaks") is None]
    if missing:
        why = []
        if any(r["scope"] == "full" for r in missing):
            why.append("the full prefill")
        if any(r["scope"] == "train" for r in missing):
            why.append("training steps")
        if any(r["scope"] == "vision" and r["compiled"] for r in missing):
            why.append("compiled rows")
        plain = [r for r in missing if r["scope"] == "vision" and not r["compiled"]]
        if plain and not graph_breaks:
            why.append("any row, with --no-graph-breaks")
        elif plain:
            video = sorted({r["scenario"] for r in plain if _video_only(r["scenario"])})
            if video:
                why.append(f"scenarios without an image ({', '.join(video)})")
            if any(not _video_only(r["scenario"]) for r in plain):
                why.append("scenarios where counting failed (see the errors)")
        notes.append("breaks '-': not counted -- graph breaks (torch._dynamo.explain) are counted for the uncompiled "
                     f"vision tower on a scenario's image input, so not for: {'; '.join(why)}")
    return notes


def machine(device: str) -> dict:
    import transformers

    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def write_results(out_dir: str, name: str, config: dict, records: list[dict], plot: bool = True,
                  errors: list[dict] = (), not_run: list[dict] = (), skipped: list[dict] = ()) -> dict:
    """Write ``<name>.json``, ``<name>.csv`` and (with matplotlib) ``<name>.png``; returns the paths.

    ``errors`` (scenarios that failed), ``not_run`` (cut by a deadline) and ``skipped`` (scenarios a family
    cannot take) go into the JSON too.
    """
    os.makedirs(out_dir, exist_ok=True)
    rows = pairs(records)
    result = {"benchmark": "syncfree bench", "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": machine(config.get("device", "cpu")), "config": config, "pairs": rows, "records": records,
              "errors": list(errors), "not_run": list(not_run),
              "skipped": list(skipped)}
    paths = {"json": os.path.join(out_dir, f"{name}.json"), "csv": os.path.join(out_dir, f"{name}.csv")}
    with open(paths["json"], "w") as f:
        json.dump(result, f, indent=2)
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["model"])
        writer.writeheader()
        writer.writerows(rows)
    if plot and rows:
        try:
            paths["png"] = _plot(rows, os.path.join(out_dir, f"{name}.png"), result["machine"])
        except ImportError:
            paths["png"] = None  # matplotlib is in the `bench` extra
    return paths


def _plot(rows: list[dict], path: str, info: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['scenario']} {r['scope']}{' compiled' if r['compiled'] else ''}" for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.55 * len(rows)), 8), sharex=True)
    x = range(len(rows))
    ax1.bar(x, [r["ratio"] for r in rows], color=["tab:green" if r["ratio"] < 1 else "tab:red" for r in rows])
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_ylabel("patched / stock latency")
    ax1.set_title(f"syncfree bench on {info.get('gpu', 'CPU')} (torch {info['torch']}, "
                  f"transformers {info['transformers']})")
    width = 0.4
    ax2.bar([i - width / 2 for i in x], [r["stock_syncs"] or 0 for r in rows], width, label="stock")
    ax2.bar([i + width / 2 for i in x], [r["patched_syncs"] or 0 for r in rows], width, label="patched")
    ax2.set_ylabel("host syncs per forward")
    ax2.legend()
    ax2.set_xticks(list(x))
    ax2.set_xticklabels(labels, rotation=90, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
