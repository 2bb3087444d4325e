"""The headline numbers, one row per claim with its source and versions (README.md and docs/benchmarks.md)."""

from __future__ import annotations

import glob
import os
import statistics

from . import common
from .census import census_rows
from .common import COMMANDS, bold_zero, load, some_zero, span, table, versions_of

__all__ = ["render_headlines", "render_headlines_full"]


# ---- headline numbers (README) ---------------------------------------------------------------------------
def _device_work_headlines(census: list[dict]) -> list[tuple]:
    """Kernel launches and whole-forward graph breaks of the fully supported families' tiny models, where the census
    counted them."""
    counted = [r for r in census if r.get("stock_launches") and r.get("patched_launches")]
    if not counted:
        return []
    ratios = [r["patched_launches"] / r["stock_launches"] for r in counted]
    rows = [(f"kernel launches per forward: each of the {len(counted)} fully supported families (tiny models), "
             "patched with `prepare` / stock",
             f"{min(ratios):.2f}–{max(ratios):.2f}, median {statistics.median(ratios):.2f}",
             f"`{COMMANDS['census.json']}`")]
    breaks = [r for r in counted if r.get("stock_breaks") is not None and r.get("patched_breaks") is not None]
    if breaks:
        whole = [r for r in breaks if r["patched_breaks"] == 0]
        where = (", the others in [Families](docs/families.md)" if len(whole) < len(breaks)
                 else ", streams in [Families](docs/families.md#a-stream-under-torchcompile)")
        rows.append((f"graph breaks of the whole forward with `prepare` (tiny models): one graph in {len(whole)} of "
                     f"{len(breaks)} families{where}",
                     f"{span(r['stock_breaks'] for r in breaks)} → {some_zero([r['patched_breaks'] for r in breaks])}",
                     f"`{COMMANDS['census.json']}`"))
    return rows


def _headline_rows() -> list[tuple[str, str, str, str]]:
    """Each headline: what, stock → syncfree, the command that recorded it, the versions it ran on."""
    bench = load("bench-cpu.json")["pairs"]
    vision = [p for p in bench if p["stock_graph_breaks"] is not None]
    ratios = [p["ratio"] for p in bench]
    census = [r for r in census_rows() if r["status"] == "ok" and r["support"] == "full"]
    shapes = [load(os.path.basename(f)) for f in sorted(glob.glob(os.path.join(common.RESULTS, "audit-*.json")))]
    gen = {(r["cache"], r["variant"]): r for r in load("generate_syncs.json")["rows"]}
    train = {n: load(f"train-{n}.json") for n in ("qwen3-vl-2b", "qwen3-vl-2b-ckpt")}
    launches = {(r["scenario"], r["variant"]): r for r in load("launch_counts.json")["rows"]}
    video = max({s for s, _ in launches}, key=lambda s: launches[(s, "stock")]["launches"])
    host = [r for r in load("host_cost.json")["rows"] if r["model"].startswith("qwen3-vl")]
    emulation = load("emulation_overhead.json")

    def syncs(doc, variant):
        return doc[variant]["summary"]["syncs"]

    bench_command = f"`{COMMANDS['bench-cpu.json']}`"
    rows = [
        ("host syncs per forward: Qwen3-VL-2B/8B and Qwen2.5-VL-7B shapes, 7 input kinds, vision tower and prefill",
         f"{span(p['stock_syncs'] for p in bench)} → {bold_zero(span(p['patched_syncs'] for p in bench))}",
         bench_command),
        ("graph breaks of the vision tower (`torch._dynamo.explain`)",
         f"{span(p['stock_graph_breaks'] for p in vision)} → "
         f"{bold_zero(span(p['patched_graph_breaks'] for p in vision))}", bench_command),
        (f"host syncs per forward: each of the {len(census)} fully supported families (tiny models)",
         f"{span(r['stock_syncs'] for r in census)} → {some_zero([r['prepared_syncs'] for r in census])}",
         f"`{COMMANDS['census.json']}`"),
        *_device_work_headlines(census),
        ("host syncs per forward: other families at their published shapes",
         f"{span(syncs(d, 'stock') for d in shapes)} → "
         f"{some_zero([syncs(d, 'patched+prepare') for d in shapes])}",
         "`syncfree audit --compare --model glm4.1v-9b --inputs images --text-layers 2` (13.1 GB, 3.7 min on 2 cores)"),
        (f"host syncs per `generate()` call ({load('generate_syncs.json')['run']['new_tokens']} new tokens)",
         f"{gen[('dynamic', 'stock')]['total']} → {gen[('dynamic', 'patched+prepare')]['total']} "
         "(the generation loop's own)", "`python benchmarks/generate_syncs.py`"),
        ("host syncs per training step: Qwen3-VL-2B, without / with gradient checkpointing",
         f"{syncs(train['qwen3-vl-2b'], 'stock')} / {syncs(train['qwen3-vl-2b-ckpt'], 'stock')} → "
         f"{bold_zero(syncs(train['qwen3-vl-2b'], 'patched+prepare'))} / "
         f"{bold_zero(syncs(train['qwen3-vl-2b-ckpt'], 'patched+prepare'))}",
         "`syncfree audit --train --model qwen3-vl-2b --inputs image --text-layers 2 --dtype bfloat16 "
         "--grad-ckpt non-reentrant`"),
        (f"kernel launches of the Qwen3-VL-8B vision tower, {video}, `vision_attention=\"grouped\"`",
         f"{launches[(video, 'stock')]['launches']} → {launches[(video, 'grouped')]['launches']} "
         f"({launches[(video, 'stock')]['launches'] / launches[(video, 'grouped')]['launches']:.2f}× fewer)",
         "`python benchmarks/launch_counts.py`"),
        ("CPU latency, patched / stock (a CPU has no device to wait for: the host plan costs nothing measurable)",
         f"{min(ratios):.2f}–{max(ratios):.2f}, median {statistics.median(ratios):.2f}", bench_command),
        ("host time of `prepare()`, one image to a 32k-token batch (1 thread)",
         f"{min(r['ms_1_thread'] for r in host):.2f}–{max(r['ms_1_thread'] for r in host):.2f} ms",
         "`python benchmarks/host_cost.py`"),
        ("the emulated device's time / a plain CPU forward (outputs bit-identical)", f"{emulation['ratio']:.2f}",
         "`python benchmarks/emulation_overhead.py`"),
        _stream_headline(),
    ]
    sources = (["bench-cpu.json"] * 2 + ["census.json"] * (1 + len(_device_work_headlines(census)))
               + ["audit-*.json", "generate_syncs.json", "train-qwen3-vl-2b.json", "launch_counts.json",
                  "bench-cpu.json", "host_cost.json", "emulation_overhead.json", _STREAM])
    return [(*row, versions_of(source)) for row, source in zip(rows, sources)]


# (Inductor's caches empty at the start of each side and kept through its stream, as a new job's first run has them:
# the caches-off table builds a kernel that two graphs share twice)
_STREAM = "compile_stream_fresh_caches.json"


def _stream_headline() -> tuple[str, str, str]:
    """Graphs and compile seconds of one compiled model over a stream of layouts, stock → patched, over the families
    ``compile_stream_fresh_caches.json`` holds."""
    rows = load(_STREAM)["rows"]
    faster = [r for r in rows if r["patched"]["compile_s"] <= r["stock"]["compile_s"]]
    ratios = [r["patched"]["compile_s"] / r["stock"]["compile_s"] for r in rows]
    return (f"one compiled model over {rows[0]['batches']} varied layouts ({len(rows)} families, tiny, CPU, empty "
            "caches): graphs; compile time patched / stock",
            f"{span(r['stock']['graphs'] for r in rows)} → **{span(r['patched']['graphs'] for r in rows)}**; "
            f"{min(ratios):.2f}–{max(ratios):.2f} (≤ 1 in {len(faster)})",
            f"`{COMMANDS[_STREAM]}`")


# The README keeps these headlines (by their measure's first words); the benchmarks page has them all.
_README_HEADLINES = ("host syncs per forward: Qwen3-VL", "host syncs per forward: each of",
                     "graph breaks of the whole forward", "host syncs per training step",
                     "host syncs per `generate()`", "host time of `prepare()`", "one compiled model over")


def render_headlines() -> str:
    """README: the headline rows, without their commands (the benchmarks page lists each with its command and
    versions)."""
    rows = [(m, v) for m, v, _, _ in _headline_rows() if m.startswith(_README_HEADLINES)]
    return (table(("measure", "stock → syncfree"), rows)
            + "\nEach with the command that reproduces it and the versions it ran on: "
              "[Benchmarks](docs/benchmarks.md#headlines).\n")


def render_headlines_full() -> str:
    """Benchmarks page: every headline, its command and versions."""
    rows = [(m.replace("](docs/", "]("), v, c, ver) for m, v, c, ver in _headline_rows()]  # (links from docs/)
    return table(("measure", "stock → syncfree", "reproduce with", "measured on"), rows)
