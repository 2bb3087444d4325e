"""The tables README.md and docs/ show, rendered from the recorded results in benchmarks/results.

Each generated table sits in a Markdown file between two markers:

    <!-- begin table: NAME (python benchmarks/tables.py) -->
    ...
    <!-- end table: NAME -->

Run: python benchmarks/tables.py           rewrites every such block from benchmarks/results
     python benchmarks/tables.py --check   changes nothing; exit 1 naming each block that differs

The test suite runs the check (tests/test_docs.py), so a table cannot drift from its data: record new results,
run this script, commit both. Only the standard library is used (no torch), so it runs anywhere in a second.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import re
import statistics
import sys
from typing import Callable

__all__ = ["RESULTS", "DOCUMENTS", "RENDERERS", "DISPLAY", "NOT_FAMILIES", "display_name", "blocks", "render", "stale",
           "update", "main"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
# The Markdown files that may hold generated blocks.
DOCUMENTS = ("README.md", "docs")

_BLOCK = re.compile(r"(<!-- begin table: (?P<name>[\w-]+) \(python benchmarks/tables\.py\) -->\n)(?P<body>.*?)"
                    r"(<!-- end table: (?P=name) -->)", re.S)

# Model types as their authors write them (a model type missing here is shown as it is): each family group declares its
# own (``GROUP = FamilyGroup(..., display={...})`` in src/syncfree/families/<group>/__init__.py, read here from the
# source: this script imports neither syncfree nor torch); these are census rows of model types no group declares.
NOT_FAMILIES = {"radio": "RADIO", "inkling2": "Inkling2", "apertus1p5": "Apertus 1.5"}


def _declared_display(families: str = os.path.join(ROOT, "src", "syncfree", "families")) -> dict[str, str]:
    """Every family group's ``display={...}`` literal, in the order of the folders' names."""
    names: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(families, "*", "__init__.py"))):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "display":
                names.update(ast.literal_eval(node.value))
    return names


DISPLAY = {**_declared_display(), **NOT_FAMILIES}

# What a remaining sync's source file is, where the census names one.
_WHY_LEFT = {
    "transformers/integrations/moe.py": "PyTorch's grouped-matmul fallback for MoE experts in float32 "
                                        "(0 in bfloat16 on sm_90/sm_100 GPUs)",
}

# The command that writes each recorded file (the files that record their own command are read from it).
COMMANDS = {
    "census.json": "syncfree census --out results",
    "compile_stream.json": "python benchmarks/compile_stream.py --families FAMILY ... --batches 16 --append "
                           "--out results/compile_stream.json (run by groups of families; each run keeps the other "
                           "families' rows)",
    "compile_stream_fresh_caches.json": "python benchmarks/compile_stream.py --families FAMILY ... --batches 16 "
                                        "--stages --inductor-caches fresh --append "
                                        "--out results/compile_stream_fresh_caches.json",
    "bench-cpu.json": "syncfree bench --device cpu --models qwen3-vl-2b qwen3-vl-8b qwen2.5-vl-7b --budget 8 "
                      "--repeats 3 --out results --name bench-cpu",
    "bench-cpu-compiled.json": "syncfree bench --device cpu --models qwen3-vl-2b --scenarios image-448 "
                               "images-8x224 --scopes vision --compile --repeats 3 --budget 8 "
                               "--out results --name bench-cpu-compiled",
    "bench-cpu-whole-compiled.json": "syncfree bench --device cpu --models qwen3-vl-2b qwen2.5-vl-7b --scenarios "
                                     "image-448 --scopes full --compile --text-layers 2 --repeats 5 --budget 20 "
                                     "--no-graph-breaks --out results --name bench-cpu-whole-compiled",
    "bench-cpu-train.json": "syncfree bench --device cpu --models qwen3-vl-2b --scenarios image-448 images-8x224 "
                            "--scopes train --repeats 3 --budget 8 --out results --name bench-cpu-train",
    "launch_counts.json": "python benchmarks/launch_counts.py --out results/launch_counts.json",
    "attention_crossover.json": "python benchmarks/attention_crossover.py --out-dir results",
    "host_cost.json": "python benchmarks/host_cost.py --repeats 20 --syncs --out results/host_cost.json",
    "host_cost_families.json": "python benchmarks/host_cost.py --families --repeats 100 "
                               "--out benchmarks/results/host_cost_families.json",
    "generate_syncs.json": "python benchmarks/generate_syncs.py --out results/generate_syncs.json",
    "emulation_overhead.json": "python benchmarks/emulation_overhead.py "
                               "--out results/emulation_overhead.json",
    "packing.json": "python benchmarks/packing.py --steps 2 --out results/packing.json",
}

_SCENARIOS = {
    "image-448": "one 448 px image", "image-896": "one 896 px image", "image-1344": "one 1344 px image",
    "images-8x224": "8 images of 224 px", "video-16x448": "a 16-frame 448 px video",
    "image+video": "an image and a video", "batch-4": "4 requests, 1-4 images each",
}


def display_name(model_type: str) -> str:
    # (an Omni family's thinker, the model type a benchmark compiles, shows as its family: "... (thinker)")
    return DISPLAY.get(model_type, DISPLAY.get(model_type.removesuffix("_thinker"), model_type))


def _load(name: str):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def _table(head: tuple[str, ...], rows: list[tuple], align: str = "") -> str:
    """A Markdown table; ``align`` has one letter per column, ``r`` for right-aligned (default left)."""
    align = align.ljust(len(head), "l")
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    lines = ["| " + " | ".join(head) + " |", rule]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _span(values) -> str:
    values = sorted(set(values))
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms"


def _bold_zero(value) -> str:
    return "**0**" if str(value) == "0" else str(value)


def _some_zero(values: list[int]) -> str:
    """'**0** in 22 of 33 (2–4 in the others)', or '**0**' where all are."""
    others = [v for v in values if v]
    if not others:
        return "**0**"
    return f"**0** in {len(values) - len(others)} of {len(values)} ({_span(others)} in the others)"


def _reproduce(name: str) -> str:
    """Where a table's numbers were recorded, by which command, on which versions."""
    return f"Recorded in `benchmarks/results/{name}` by `{COMMANDS[name]}`{_versions_note(name)}.\n"


# ---- the census: which families syncfree supports, and what each still syncs -----------------------------
def _census_rows() -> list[dict]:
    return _load("census.json")["rows"]


def _where_left(left: str) -> str:
    """'4 at transformers/integrations/moe.py:379' -> the file's line and why it syncs."""
    where = re.sub(r"^\d+ at ", "", left)
    why = next((text for path, text in _WHY_LEFT.items() if where.startswith(path)), "")
    return f"`{where}`" + (f": {why}" if why else "")


def _support(row: dict) -> str:
    if row["support"] == "changed":
        return "left stock (this release changed its code)"
    return {"full": "full", "generic": "generic fix", "none": "none"}.get(row["support"], row["support"])


def _census_summary(rows: list[dict], meta: dict) -> str:
    count = {level: sum(r["support"] == level for r in rows) for level in ("full", "generic", "none", "changed")}
    ran = sum(r["status"] == "ok" for r in rows)
    changed = f", {count['changed']} left stock (their code changed)" if count["changed"] else ""
    return (f"{len(rows)} families: {count['full']} fully supported, {count['generic']} with the generic fix, "
            f"{count['none']} not supported{changed}; {ran} built and ran (Transformers {meta['transformers']}, "
            f"PyTorch {meta['torch'].split('+')[0]}).\n")


def render_support() -> str:
    """README: the census grouped by support level and what remains with ``prepare``."""
    meta = _load("census.json")
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in meta["rows"]:
        if row["status"] != "ok":
            remains = f"not run: {row['reason']}"
        elif row["support"] == "full" and row["prepared_syncs"] == 0:
            remains = "nothing"
        elif row["support"] == "full":
            remains = _where_left(row["left"])
        elif row["support"] == "changed":
            remains = row["reason"]
        else:
            remains = f"stock's other reads: `syncfree patch --report --model {row['family']}` lists them"
        groups.setdefault((_support(row), remains), []).append(row)
    out = []
    rank = {"full": 0, "generic fix": 1, "none": 2}
    for (support, remains), rows in sorted(groups.items(), key=lambda g: (rank.get(g[0][0], 3), -len(g[1]))):
        names = ", ".join(sorted((display_name(r["family"]) for r in rows), key=str.lower))
        ran = [r for r in rows if r["status"] == "ok"]
        if not ran:
            syncs = "—"
        elif support == "full":
            syncs = f"{_span(r['stock_syncs'] for r in ran)} → {_bold_zero(_span(r['prepared_syncs'] for r in ran))}"
        else:
            syncs = f"{_span(r['stock_syncs'] for r in ran)} → {_span(r['patched_syncs'] for r in ran)}"
        out.append((support, names, syncs, remains))
    head = ("support", "families", "syncs per forward, stock → syncfree", "what remains")
    return _table(head, out) + "\n" + _census_summary(meta["rows"], meta)


def render_families() -> str:
    """docs/families.md: one row per family the census found."""
    meta = _load("census.json")
    rows = []
    for r in meta["rows"]:
        name = f"{display_name(r['family'])} (`{r['family']}`)"
        if r["status"] != "ok":
            rows.append((name, _support(r), "not run", "", "", "", r["reason"]))
            continue
        prepared = "—" if r["prepared_syncs"] is None else _bold_zero(r["prepared_syncs"])
        left = r["reason"] if r["support"] == "changed" else (_where_left(r["left"]) if r["left"] else "")
        rows.append((name, _support(r), f"{r['stock_syncs']} ({r['stock_blocking']})", r["patched_syncs"],
                     prepared, "yes" if r["same_outputs"] else "**no**", left))
    head = ("family", "support", "stock syncs (blocking copies)", "patched", "patched + `prepare`", "outputs equal",
            "what is left")
    return (_table(head, rows, "llrrrl") + "\n" + _census_summary(meta["rows"], meta) + _reproduce("census.json"))


def _arrow(row: dict, stock: str, patched: str) -> str:
    if row.get(stock) is None:
        return "—"
    after = row.get(patched)
    return f"{row[stock]} → {'—' if after is None else after}"


def render_device_work() -> str:
    """docs/families.md: per fully supported family, the kernel launches, whole-forward graph breaks (and the first
    site left) and host milliseconds of the tiny model's forward, stock → patched with ``prepare``."""
    meta = _load("census.json")
    rows = []
    for r in meta["rows"]:
        if r["status"] != "ok" or r["support"] != "full":
            continue
        sites = r.get("break_sites") or []
        first = f"`{sites[0].split(': ', 1)[0]}` ({len(sites)} sites)" if sites else ""
        rows.append((f"{display_name(r['family'])} (`{r['family']}`)", _arrow(r, "stock_launches", "patched_launches"),
                     _arrow(r, "stock_breaks", "patched_breaks"), first, _arrow(r, "stock_ms", "patched_ms")))
    head = ("family", "kernel launches", "graph breaks (whole forward)", "most frequent break left", "host ms")
    return (_table(head, rows, "lrrlr") + "\nKernel launches are counted on the emulated device (views, allocations and "
            "copies left out); graph breaks by `torch._dynamo.explain` of the whole forward; host milliseconds are the "
            "median of five CPU forwards, `prepare` included on every patched call. `census.json` lists every break "
            "site of each family (`break_sites`). " + _reproduce("census.json"))


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
                     f"{_span(r['stock_breaks'] for r in breaks)} → {_some_zero([r['patched_breaks'] for r in breaks])}",
                     f"`{COMMANDS['census.json']}`"))
    return rows


def _headline_rows() -> list[tuple[str, str, str, str]]:
    """Each headline: what, stock → syncfree, the command that recorded it, the versions it ran on."""
    bench = _load("bench-cpu.json")["pairs"]
    vision = [p for p in bench if p["stock_graph_breaks"] is not None]
    ratios = [p["ratio"] for p in bench]
    census = [r for r in _census_rows() if r["status"] == "ok" and r["support"] == "full"]
    shapes = [_load(os.path.basename(f)) for f in sorted(glob.glob(os.path.join(RESULTS, "audit-*.json")))]
    gen = {(r["cache"], r["variant"]): r for r in _load("generate_syncs.json")["rows"]}
    train = {n: _load(f"train-{n}.json") for n in ("qwen3-vl-2b", "qwen3-vl-2b-ckpt")}
    launches = {(r["scenario"], r["variant"]): r for r in _load("launch_counts.json")["rows"]}
    video = max({s for s, _ in launches}, key=lambda s: launches[(s, "stock")]["launches"])
    host = [r for r in _load("host_cost.json")["rows"] if r["model"].startswith("qwen3-vl")]
    emulation = _load("emulation_overhead.json")

    def syncs(doc, variant):
        return doc[variant]["summary"]["syncs"]

    bench_command = f"`{COMMANDS['bench-cpu.json']}`"
    rows = [
        ("host syncs per forward: Qwen3-VL-2B/8B and Qwen2.5-VL-7B shapes, 7 input kinds, vision tower and prefill",
         f"{_span(p['stock_syncs'] for p in bench)} → {_bold_zero(_span(p['patched_syncs'] for p in bench))}",
         bench_command),
        ("graph breaks of the vision tower (`torch._dynamo.explain`)",
         f"{_span(p['stock_graph_breaks'] for p in vision)} → "
         f"{_bold_zero(_span(p['patched_graph_breaks'] for p in vision))}", bench_command),
        (f"host syncs per forward: each of the {len(census)} fully supported families (tiny models)",
         f"{_span(r['stock_syncs'] for r in census)} → {_some_zero([r['prepared_syncs'] for r in census])}",
         f"`{COMMANDS['census.json']}`"),
        *_device_work_headlines(census),
        ("host syncs per forward: other families at their published shapes",
         f"{_span(syncs(d, 'stock') for d in shapes)} → "
         f"{_some_zero([syncs(d, 'patched+prepare') for d in shapes])}",
         "`syncfree audit --compare --model glm4.1v-9b --inputs images --text-layers 2` (13.1 GB, 3.7 min on 2 cores)"),
        (f"host syncs per `generate()` call ({_load('generate_syncs.json')['run']['new_tokens']} new tokens)",
         f"{gen[('dynamic', 'stock')]['total']} → {gen[('dynamic', 'patched+prepare')]['total']} "
         "(the generation loop's own)", "`python benchmarks/generate_syncs.py`"),
        ("host syncs per training step: Qwen3-VL-2B, without / with gradient checkpointing",
         f"{syncs(train['qwen3-vl-2b'], 'stock')} / {syncs(train['qwen3-vl-2b-ckpt'], 'stock')} → "
         f"{_bold_zero(syncs(train['qwen3-vl-2b'], 'patched+prepare'))} / "
         f"{_bold_zero(syncs(train['qwen3-vl-2b-ckpt'], 'patched+prepare'))}",
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
                  "bench-cpu.json", "host_cost.json", "emulation_overhead.json", "compile_stream.json"])
    return [(*row, _versions_of(source)) for row, source in zip(rows, sources)]


def _stream_headline() -> tuple[str, str, str]:
    """Graphs and compile seconds of one compiled model over a stream of layouts, stock → patched, over the families
    ``compile_stream.json`` holds."""
    rows = _load("compile_stream.json")["rows"]
    faster = [r for r in rows if r["patched"]["compile_s"] <= r["stock"]["compile_s"]]
    ratios = [r["patched"]["compile_s"] / r["stock"]["compile_s"] for r in rows]
    return (f"one compiled model over {rows[0]['batches']} varied layouts ({len(rows)} families, tiny, CPU): graphs; "
            "compile time patched / stock",
            f"{_span(r['stock']['graphs'] for r in rows)} → **{_span(r['patched']['graphs'] for r in rows)}**; "
            f"{min(ratios):.2f}–{max(ratios):.2f} (≤ 1 in {len(faster)})",
            f"`{COMMANDS['compile_stream.json']}`")


def _versions_of(name: str) -> str:
    """``torch X, Transformers Y`` of a recorded file (the first of a glob), or what it records of them."""
    paths = sorted(glob.glob(os.path.join(RESULTS, name)))
    if not paths:
        return ""
    with open(paths[0]) as f:
        doc = json.load(f)
    found: dict = {}
    todo = [doc]
    while todo and len(found) < 2:
        d = todo.pop(0)
        if isinstance(d, dict):
            for key, value in d.items():
                if key in ("torch", "transformers") and isinstance(value, str):
                    found.setdefault(key, value.split("+")[0])
                elif isinstance(value, dict):
                    todo.append(value)
    return ", ".join(f"{'PyTorch' if k == 'torch' else 'Transformers'} {found[k]}" for k in ("torch", "transformers")
                     if k in found)


# The README keeps these headlines (by their measure's first words); the benchmarks page has them all.
_README_HEADLINES = ("host syncs per forward: Qwen3-VL", "host syncs per forward: each of",
                     "graph breaks of the whole forward", "host syncs per training step",
                     "host syncs per `generate()`", "host time of `prepare()`", "one compiled model over")


def render_headlines() -> str:
    """README: the headline rows, without their commands (the benchmarks page lists each with its command and
    versions)."""
    rows = [(m, v) for m, v, _, _ in _headline_rows() if m.startswith(_README_HEADLINES)]
    return (_table(("measure", "stock → syncfree"), rows)
            + "\nEach with the command that reproduces it and the versions it ran on: "
              "[Benchmarks](docs/benchmarks.md#headlines).\n")


def render_headlines_full() -> str:
    """Benchmarks page: every headline, its command and versions."""
    rows = [(m.replace("](docs/", "]("), v, c, ver) for m, v, c, ver in _headline_rows()]  # (links from docs/)
    return _table(("measure", "stock → syncfree", "reproduce with", "measured on"), rows)





# ---- benchmarks page -------------------------------------------------------------------------------------
def render_bench_cpu() -> str:
    doc = _load("bench-cpu.json")
    pairs = doc["pairs"]
    rows = [(p["model"], _SCENARIOS.get(p["scenario"], p["scenario"]), p["scope"], _ms(p["stock_ms"]),
             _ms(p["patched_ms"]), f"{p['ratio']:.2f}", p["stock_syncs"], _bold_zero(p["patched_syncs"]),
             "" if p["stock_graph_breaks"] is None else f"{p['stock_graph_breaks']} → {p['patched_graph_breaks']}")
            for p in pairs]
    ratios = [p["ratio"] for p in pairs]
    m = doc["machine"]
    head = ("model", "scenario", "scope", "stock", "patched", "patched / stock", "stock syncs", "patched syncs",
            "graph breaks")
    return (f"{len(pairs)} cells; patched / stock latency {min(ratios):.2f}–{max(ratios):.2f}, median "
            f"{statistics.median(ratios):.2f}. PyTorch {m['torch'].split('+')[0]}, Transformers {m['transformers']}, "
            f"{m['cpus']} CPU cores, {doc['config']['dtype']}, SDPA.\n\n"
            + _table(head, rows, "lllrrrrrr") + "\n" + _reproduce("bench-cpu.json"))


def render_bench_compiled() -> str:
    pairs = _load("bench-cpu-compiled.json")["pairs"]
    by = {(p["scenario"], p["compiled"]): p for p in pairs}
    rows = []
    for scenario in dict.fromkeys(p["scenario"] for p in pairs):
        eager, compiled = by[(scenario, False)], by[(scenario, True)]
        rows.append((_SCENARIOS.get(scenario, scenario), _ms(eager["stock_ms"]), _ms(eager["patched_ms"]),
                     _ms(compiled["stock_ms"]), _ms(compiled["patched_ms"])))
    head = ("scenario", "stock eager", "patched eager", "stock compiled", "patched compiled")
    return _table(head, rows, "lrrrr") + "\n" + _reproduce("bench-cpu-compiled.json")


def render_whole_compiled() -> str:
    """README and benchmarks page: the whole prefill, eager and compiled (inductor), stock and patched + prepared, each
    as a ratio to stock eager, measured in one run."""
    doc = _load("bench-cpu-whole-compiled.json")
    by = {(p["model"], p["compiled"]): p for p in doc["pairs"]}
    rows = []
    for model in dict.fromkeys(p["model"] for p in doc["pairs"]):
        eager, compiled = by.get((model, False)), by.get((model, True))
        if eager is None or compiled is None:
            continue
        base = eager["stock_ms"]
        rows.append((model, _ms(base), "1.00", f"{compiled['stock_ms'] / base:.2f}", f"{eager['patched_ms'] / base:.2f}",
                     f"{compiled['patched_ms'] / base:.2f}"))
    m = doc["machine"]
    head = ("vision shapes (2 text layers)", "stock eager ms", "stock eager", "stock compiled", "patched eager",
            "patched compiled, one graph")
    return (_table(head, rows, "lrrrrr") + f"\nOne 448 px image, the prefill's time as a ratio to stock eager (lower is "
            f"faster); compiled with inductor, stock as Transformers compiles it (`fullgraph=False`), patched with "
            f"inputs from `prepare` and `fullgraph=True`. PyTorch {m['torch'].split('+')[0]}, Transformers "
            f"{m['transformers']}, {m['cpus']} CPU cores, {doc['config']['dtype']}. " + _reproduce(
                "bench-cpu-whole-compiled.json"))


def render_bench_train() -> str:
    pairs = _load("bench-cpu-train.json")["pairs"]
    rows = [(p["model"], _SCENARIOS.get(p["scenario"], p["scenario"]), _ms(p["stock_ms"]), _ms(p["patched_ms"]),
             f"{p['ratio']:.2f}", f"{p['stock_syncs']} → {_bold_zero(p['patched_syncs'])}") for p in pairs]
    head = ("model", "scenario", "stock step", "patched step", "patched / stock", "syncs per step")
    return _table(head, rows, "llrrrr") + "\n" + _reproduce("bench-cpu-train.json")


def render_launch_counts() -> str:
    doc = _load("launch_counts.json")
    by = {(r["scenario"], r["variant"]): r for r in doc["rows"]}
    variants = [v for v in dict.fromkeys(r["variant"] for r in doc["rows"]) if v != "stock"]
    rows = []
    for scenario in dict.fromkeys(r["scenario"] for r in doc["rows"]):
        stock = by[(scenario, "stock")]
        rows.append((scenario, stock["launches"], *(by[(scenario, v)]["launches"] for v in variants),
                     f"{stock['attention_calls']} → {by[(scenario, 'grouped')]['attention_calls']}"))
    head = ("input", "stock", *(f"patched `{v}`" for v in variants), "attention calls, stock → `grouped`")
    return (f"{doc['model']} vision tower ({doc['vision_depth']} blocks), kernel launches of one forward:\n\n"
            + _table(head, rows, "l" + "r" * (len(variants) + 2)) + "\n" + _reproduce("launch_counts.json"))


def render_attention_crossover() -> str:
    doc = _load("attention_crossover.json")
    cells = doc["cells"]
    names = doc["grid"]["backends"]

    def cell_time(c, b):
        return c["backends"][b]["ms"]

    rows = []
    for c in cells:
        fastest = min(names, key=lambda b: cell_time(c, b))
        rows.append((c["shape"], f"{c['total']:,} × {c['segments']}",
                     *(f"**{_ms(cell_time(c, b))}**" if b == fastest else _ms(cell_time(c, b)) for b in names),
                     f"{c['backends']['block_diagonal']['peak_rss_mib']:,.0f} MiB"))
    wins = doc["summary"]["block_diagonal_beats_split_and_grouped"]
    equal = sum(c["backends"]["grouped"].get("equal_to_split", False) for c in cells)
    head = ("shape", "patches × segments", *(f"`{b}`" for b in names), "`block_diagonal` peak memory")
    return (f"`block_diagonal` beats both others in {len(wins)} of {len(cells)} cells; `grouped` is bit-identical to "
            f"`split` in {equal} of {len(cells)}. The fastest of each row is in bold.\n\n"
            + _table(head, rows, "llrrrr") + "\n" + _reproduce("attention_crossover.json"))


def render_host_cost() -> str:
    now = _load("host_cost.json")
    before = {(r["model"], r["layout"]): r for r in _load("host_cost_before.json")["rows"]}
    rows = []
    for r in now["rows"]:
        old = before.get((r["model"], r["layout"]))
        was = f"{old['ms_1_thread']:.2f} → " if old else ""
        upload = f"{old['plan_bytes'] / 1e3:,.0f} → " if old else ""
        syncs = f"{r['syncs']['stock']} → {r['syncs']['prepared']}" if "syncs" in r else ""
        rows.append((r["model"], r["layout"], f"{r['tokens']:,}", f"{r['patches']:,}",
                     f"{was}**{r['ms_1_thread']:.2f} ms**", f"{upload}{r['plan_bytes'] / 1e3:,.0f} KB", syncs))
    head = ("model", "layout", "tokens", "patches", "`prepare()` host time, earlier plan → now", "plan upload",
            "syncs, stock → prepared")
    load = _load("host_cost_under_load.json")
    before_load, after_load = (next(v for k, v in load.items() if k.startswith(w)) for w in ("before", "after"))
    loaded = "; ".join(
        f"{b['model']}: {b['ms_1_thread']:.1f} → {a['ms_1_thread']:.1f} ms with 1 thread, "
        f"{b['ms_default_threads']:.1f} → {a['ms_default_threads']:.1f} ms with {now['default_threads']} threads"
        for b, a in zip(before_load["rows"], after_load["rows"]))
    return (f"{now['method']}; 1 thread, {now['cpus']} CPU cores. The earlier plan made Qwen2.5-VL's window table "
            "window by window in Python and uploaded int64 positions and one checksum weight per token "
            "(`host_cost_before.json`).\n\n"
            + _table(head, rows, "llrrrrr") + "\n" + _reproduce("host_cost.json")
            + f"\nWith both cores kept busy by two other processes, the largest batch, when the per-patch tables moved "
            f"to the device (host tables → device tables): {loaded} (`host_cost_under_load.json`).\n")


def render_host_cost_families() -> str:
    """docs/benchmarks.md: every fully supported family's plan at its largest standard layout, before and after."""
    now = _load("host_cost_families.json")
    before = {r["family"]: r for r in _load("host_cost_families_before.json")["families"]}
    rows = []
    for r in now["families"]:
        old = before.get(r["family"], {})
        if "error" in r:
            rows.append((r["family"], "", "", r["error"], "", ""))
            continue
        rows.append((r["family"], f"{r['tokens']:,}", f"{old['ms_1_thread']:.2f}" if "ms_1_thread" in old else "",
                     f"{r['ms_1_thread']:.2f}", f"{old['bytes_per_token']:.1f}" if "bytes_per_token" in old else "",
                     f"{r['bytes_per_token']:.1f}"))
    head = ("family", "tokens", "ms before", "ms after", "B/token before", "B/token after")
    return (f"Minimum of {now['repeats']} `prepare()` calls, 1 thread, {now['cpus']} CPU cores (shared: timings "
            "move by a tenth of a millisecond from run to run); before: the earlier plan, measured by the same command "
            "on the same machine just before (`host_cost_families_before.json`).\n\n"
            + _table(head, rows, "lrrrrr") + "\n" + _reproduce("host_cost_families.json"))


def render_generate_syncs() -> str:
    doc = _load("generate_syncs.json")
    rows = [(r["cache"], r["variant"], r["prefill"], _span(r["decode_steps"]), r["outside_forwards"], r["total"],
             "yes" if r["same_ids_as_stock"] else "**no**") for r in doc["rows"]]
    run = doc["run"]
    head = ("cache", "variant", "prefill forward", "each decode step", "`generate()` outside the forwards", "total",
            "ids equal stock's")
    return (f"{run['model']} shapes, text model cut to {run['text_layers']} layers, `{run['inputs']}` inputs, "
            f"{run['new_tokens']} new tokens, emulated device, Transformers {run['transformers']}.\n\n"
            + _table(head, rows, "llrrrrl") + "\n" + _reproduce("generate_syncs.json"))


def _phase_row(label: str, doc: dict, variant: str) -> tuple:
    phases, summary = doc[variant]["phases"], doc[variant]["summary"]
    return (label, *(phases.get(p, {"syncs": 0})["syncs"] for p in ("forward", "recompute", "backward", "optimizer")),
            _bold_zero(summary["syncs"]), summary["blocking_copies"])


def render_train_steps() -> str:
    rows = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "train-*.json"))):
        doc = _load(os.path.basename(path))
        run = doc["run"]
        label = run["model"] + (f", gradient checkpointing ({run['grad_ckpt']})" if run.get("grad_ckpt") else "")
        label += f", {run.get('optimizer', 'adamw')}" if run.get("optimizer") else ""
        for variant in run["variants"]:
            rows.append(_phase_row(f"{label}: {variant}", doc, variant))
    head = ("model: variant", "forward", "recompute", "backward", "optimizer", "total", "blocking copies")
    return (_table(head, rows, "lrrrrrr") + "\nRecorded in `benchmarks/results/train-*.json` by `syncfree audit "
            "--train --model MODEL --inputs image --text-layers 2 --dtype bfloat16 [--grad-ckpt non-reentrant] "
            "[--optimizer sgd] --json PATH`" + _versions_note("train-*.json") + ".\n")


def _versions_note(pattern: str) -> str:
    """`` (PyTorch X, Transformers Y)`` of the recorded files matching ``pattern``, where they record them."""
    versions = _versions_of(pattern)
    return f" ({versions})" if versions else ""


def _dtype(name: str, doc: dict) -> str:
    command = doc.get("command") or ""
    return "bf16" if "bf16" in name or "bfloat16" in command else "fp32"


def render_published_shapes() -> str:
    rows = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "audit-*.json"))):
        name = os.path.basename(path)
        doc = _load(name)
        run = doc["run"]
        grids = "; ".join(f"{k.split('_')[0]}s {' '.join('×'.join(map(str, g)) for g in v)}"
                          for k, v in run["grids"].items())
        s = {v: doc[v]["summary"] for v in run["variants"]}
        rows.append((f"`{run['model']}`", run["vision_depth"], run["inputs"], _dtype(name, doc), grids,
                     f"{s['stock']['syncs']} ({s['stock']['blocking_copies']})", s["patched"]["syncs"],
                     _bold_zero(s["patched+prepare"]["syncs"])))
    head = ("preset", "vision blocks", "inputs", "dtype", "grids (t×h×w)", "stock syncs (blocking copies)", "patched",
            "patched + `prepare`")
    return (_table(head, rows, "lrlllrrr") + "\nRecorded in `benchmarks/results/audit-*.json` by `syncfree audit "
            "--compare --model PRESET --inputs KIND --text-layers 2 [--dtype bfloat16] [--image-side N] --json PATH`"
            + _versions_note("audit-*.json") + ".\n")


def render_emulation_overhead() -> str:
    doc = _load("emulation_overhead.json")
    return (f"{doc['model']} vision tower, one {doc['image'][0]}×{doc['image'][1]} image, median of {doc['repeats']}: "
            f"plain CPU {doc['plain_median_s']:.2f} s, emulated {doc['emulated_median_s']:.2f} s "
            f"(**{doc['ratio']:.2f}×**), outputs bit-identical: {'yes' if doc['bit_identical'] else '**no**'}; "
            f"{doc['syncs_recorded']} syncs recorded.\n" + _reproduce("emulation_overhead.json"))


def render_packing() -> str:
    doc = _load("packing.json")
    pad, rate, step = doc["padding_fraction"], doc["tokens_per_s"], doc["step_s"]
    ratio, groups = doc["ratio_packed_over_padded"], doc.get("timed_groups", doc["steps"])  # (a deadline ran fewer)
    rows = [("padding (share of the batch's positions)", f"{pad['padded']:.0%}", f"{pad['packed']:.0%}", ""),
            ("forward, sample tokens/s", f"{rate['padded']['forward']:,.0f}", f"{rate['packed']['forward']:,.0f}",
             f"**{ratio['forward']:.2f}×**"),
            ("training step, sample tokens/s", f"{rate['padded']['train']:,.0f}", f"{rate['packed']['train']:,.0f}",
             f"**{ratio['train']:.2f}×**"),
            (f"training step, s per {doc['group']} samples", f"{step['padded']['train']:.2f}",
             f"{step['packed']['train']:.2f}", "")]
    return (f"{doc['model']} shapes (random weights), {doc['text_layers']} text layers, fp32 on "
            f"{doc['machine']['cpus']} CPU cores: {groups} groups of {doc['group']} samples ({doc['sample_tokens']:,} "
            "tokens: text of 16–512 tokens, 0–4 images of "
            f"{', '.join(f'{h}×{w}' for h, w in doc['image_sides'])} px), after one warm-up group; packed rows of at most "
            f"{doc['max_tokens']} tokens.\n\n"
            + _table(("", "padded, stock", "packed, syncfree", "packed / padded"), rows, "lrrr") + "\n"
            + _reproduce("packing.json"))


def render_hf_tests() -> str:
    """Transformers' own model tests, stock vs patched, from the table in hf-tests.md."""
    with open(os.path.join(RESULTS, "hf-tests.md")) as f:
        newest = re.split(r"^# ", f.read(), flags=re.M)[1]  # (the file's records, newest first: the newest one)
    first, *later = re.split(r"^## Transformers (?=\d)", newest, flags=re.M)
    row = r"^\| (\w+) \| ([\d/]+[^|]*) \| ([\d/]+[^|]*) \| (\d+) \|$"
    found = re.findall(row, first, re.M)
    rows = [(f"{display_name(t)} (`{t}`)", stock.strip(), patched.strip(), n) for t, stock, patched, n in found]
    differ = sum(int(n) for *_, n in found)
    ran = {t for t, *_ in found}
    others = [display_name(r["family"]) for r in _census_rows() if r["support"] == "full" and r["family"] not in ran]
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
            + _table(("family", "stock", "patched", "tests that differ"), rows, "lllr") + missing
            + "".join("\n" + line for line in releases))


def _bold_if_less(form: str, value, than) -> str:
    text = form.format(value)
    return f"**{text}**" if value < than else text


def _stream_note(meta: dict) -> str:
    caches = {"off": " (cold: its caches off, so a kernel two graphs share is built twice)",
              "fresh": " (cold: its caches empty at the start of each side and kept through its stream, as a new "
                       "job's first run has them)"}.get(meta.get("inductor_caches"), "")
    return (f"Stock: `torch.compile(model)` on the processor's batches (graph breaks allowed); patched: "
            f"`torch.compile(model, fullgraph=True)` on batches from `syncfree.prepare`; the same stream of varied "
            f"layouts; backend {meta.get('backend', 'inductor')}{caches}, "
            f"{meta.get('threads', 1)} thread, 2 CPU cores. Stock's "
            f"frames that reach Dynamo's recompile limit (8) stop compiling and run eagerly from then on, so its "
            f"compile seconds stop growing while its graphs do not serve the stream.\n\n")


def _stream_cells(stock: dict, patched: dict, keys) -> list[str]:
    after = ("error: " + patched["error"]) if "error" in patched else None
    return [f"{form.format(get(stock))} → " + (after or _bold_if_less(form, get(patched), get(stock)))
            for get, form in keys]


def render_compile_stream() -> str:
    """docs/benchmarks.md: one compiled model over a stream of varied layouts, stock against patched."""
    doc = _load("compile_stream.json")
    keys = [(lambda side, k=k: side[k], form) for k, form in (("graphs", "{}"), ("compile_s", "{:.1f}"),
                                                             ("wall_s", "{:.1f}"))]
    rows = [(display_name(row["family"]), row["batches"], *_stream_cells(row["stock"], row["patched"], keys))
            for row in doc["rows"]]
    head = ("family", "batches", "graphs, stock → patched", "compile s, stock → patched", "whole stream s")
    return _stream_note(doc.get("meta", {})) + _table(head, rows, "lrrrr") + "\n" + _reproduce("compile_stream.json")


def render_compile_stream_fresh_caches() -> str:
    """docs/benchmarks.md: the same, with Inductor's caches as a new job has them, and where the seconds went."""
    name = "compile_stream_fresh_caches.json"
    doc = _load(name)
    keys = [(lambda side: side["graphs"], "{}"), (lambda side: side["compile_s"], "{:.1f}"),
            (lambda side: side["stages_s"]["bytecode_tracing"], "{:.1f}"),
            (lambda side: side["stages_s"]["aot_collect_metadata"], "{:.1f}"),
            (lambda side: side["stages_s"]["GraphLowering.codegen"], "{:.1f}"),
            (lambda side: side["cpp_build_s"], "{:.1f}")]
    rows = [(display_name(row["family"]), *_stream_cells(row["stock"], row["patched"], keys))
            for row in sorted(doc["rows"], key=lambda row: display_name(row["family"]))]
    head = ("family", "graphs", "compile s", "Dynamo tracing s", "AOTAutograd metadata s", "Inductor code generation s",
            "C++ builds s")
    return _stream_note(doc.get("meta", {})) + _table(head, rows, "lrrrrrr") + "\n" + _reproduce(name)


RENDERERS: dict[str, Callable[[], str]] = {
    "support": render_support,
    "families": render_families,
    "device-work": render_device_work,
    "headlines": render_headlines,
    "headlines-full": render_headlines_full,
    "bench-cpu": render_bench_cpu,
    "bench-cpu-compiled": render_bench_compiled,
    "bench-cpu-train": render_bench_train,
    "whole-compiled": render_whole_compiled,
    "launch-counts": render_launch_counts,
    "attention-crossover": render_attention_crossover,
    "host-cost": render_host_cost,
    "compile-stream": render_compile_stream,
    "compile-stream-fresh-caches": render_compile_stream_fresh_caches,
    "host-cost-families": render_host_cost_families,
    "generate-syncs": render_generate_syncs,
    "train-steps": render_train_steps,
    "published-shapes": render_published_shapes,
    "emulation-overhead": render_emulation_overhead,
    "packing": render_packing,
    "hf-tests": render_hf_tests,
}


# ---- the blocks in the Markdown files --------------------------------------------------------------------
def _markdown_files(root: str = ROOT) -> list[str]:
    files = []
    for entry in DOCUMENTS:
        path = os.path.join(root, entry)
        if os.path.isdir(path):
            files += sorted(glob.glob(os.path.join(path, "**", "*.md"), recursive=True))
        elif os.path.exists(path):
            files.append(path)
    return files


def blocks(root: str = ROOT) -> list[tuple[str, str, str]]:
    """(file relative to ``root``, block name, its text) for every generated block."""
    found = []
    for path in _markdown_files(root):
        with open(path) as f:
            text = f.read()
        found += [(os.path.relpath(path, root), m["name"], m["body"]) for m in _BLOCK.finditer(text)]
    return found


def render(name: str) -> str:
    if name not in RENDERERS:
        raise KeyError(f"no table named {name!r} (known: {', '.join(RENDERERS)})")
    return RENDERERS[name]()


def stale(root: str = ROOT) -> list[str]:
    """'file: name' for each generated block whose text is not what its renderer gives now."""
    return [f"{path}: {name}" for path, name, body in blocks(root) if body != render(name)]


def update(root: str = ROOT) -> list[str]:
    """Rewrite every generated block; return 'file: name' of those that changed."""
    changed = []
    for path in _markdown_files(root):
        with open(path) as f:
            text = f.read()
        where = os.path.relpath(path, root)

        def fill(m: re.Match, where: str = where) -> str:
            body = render(m["name"])
            if body != m["body"]:
                changed.append(f"{where}: {m['name']}")
            return m.group(1) + body + m.group(4)

        new = _BLOCK.sub(fill, text)
        if new != text:
            with open(path, "w") as f:
                f.write(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    global RESULTS
    parser = argparse.ArgumentParser(description="Render README.md's and docs/'s tables from benchmarks/results.")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its data")
    parser.add_argument("--results", default=RESULTS, metavar="DIR",
                        help="the folder the tables render from (default: the recorded benchmarks/results; a "
                             "reproduced run's folder, e.g. results/, which its commands write to)")
    args = parser.parse_args(argv)
    RESULTS = os.path.abspath(args.results)
    if args.check:
        differ = stale()
        for line in differ:
            print(f"out of date: {line} (run python benchmarks/tables.py)")
        return 1 if differ else 0
    changed = update()
    print("\n".join(f"rewrote {line}" for line in changed) or "every table is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
