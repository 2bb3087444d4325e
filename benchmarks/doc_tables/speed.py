"""docs/benchmarks.md's speed tables: forward, compiled and training times, launches, attention backends, packing."""

from __future__ import annotations

import statistics

from .common import SCENARIOS, bold_zero, load, ms, reproduce, table

__all__ = ["render_attention_crossover", "render_bench_compiled", "render_bench_cpu", "render_bench_train",
           "render_launch_counts", "render_packing", "render_whole_compiled"]





# ---- benchmarks page -------------------------------------------------------------------------------------
def render_bench_cpu() -> str:
    doc = load("bench-cpu.json")
    pairs = doc["pairs"]
    rows = [(p["model"], SCENARIOS.get(p["scenario"], p["scenario"]), p["scope"], ms(p["stock_ms"]),
             ms(p["patched_ms"]), f"{p['ratio']:.2f}", p["stock_syncs"], bold_zero(p["patched_syncs"]),
             "" if p["stock_graph_breaks"] is None else f"{p['stock_graph_breaks']} → {p['patched_graph_breaks']}")
            for p in pairs]
    ratios = [p["ratio"] for p in pairs]
    m = doc["machine"]
    head = ("model", "scenario", "scope", "stock", "patched", "patched / stock", "stock syncs", "patched syncs",
            "graph breaks")
    return (f"{len(pairs)} cells; patched / stock latency {min(ratios):.2f}–{max(ratios):.2f}, median "
            f"{statistics.median(ratios):.2f}. PyTorch {m['torch'].split('+')[0]}, Transformers {m['transformers']}, "
            f"{m['cpus']} CPU cores, {doc['config']['dtype']}, SDPA.\n\n"
            + table(head, rows, "lllrrrrrr") + "\n" + reproduce("bench-cpu.json"))


def render_bench_compiled() -> str:
    pairs = load("bench-cpu-compiled.json")["pairs"]
    by = {(p["scenario"], p["compiled"]): p for p in pairs}
    rows = []
    for scenario in dict.fromkeys(p["scenario"] for p in pairs):
        eager, compiled = by[(scenario, False)], by[(scenario, True)]
        rows.append((SCENARIOS.get(scenario, scenario), ms(eager["stock_ms"]), ms(eager["patched_ms"]),
                     ms(compiled["stock_ms"]), ms(compiled["patched_ms"])))
    head = ("scenario", "stock eager", "patched eager", "stock compiled", "patched compiled")
    return table(head, rows, "lrrrr") + "\n" + reproduce("bench-cpu-compiled.json")


def render_whole_compiled() -> str:
    """README and benchmarks page: the whole prefill, eager and compiled (inductor), stock and patched + prepared, each
    as a ratio to stock eager, measured in one run."""
    doc = load("bench-cpu-whole-compiled.json")
    by = {(p["model"], p["compiled"]): p for p in doc["pairs"]}
    rows = []
    for model in dict.fromkeys(p["model"] for p in doc["pairs"]):
        eager, compiled = by.get((model, False)), by.get((model, True))
        if eager is None or compiled is None:
            continue
        base = eager["stock_ms"]
        rows.append((model, ms(base), "1.00", f"{compiled['stock_ms'] / base:.2f}", f"{eager['patched_ms'] / base:.2f}",
                     f"{compiled['patched_ms'] / base:.2f}"))
    m = doc["machine"]
    head = ("vision shapes (2 text layers)", "stock eager ms", "stock eager", "stock compiled", "patched eager",
            "patched compiled, one graph")
    return (table(head, rows, "lrrrrr") + f"\nOne 448 px image, the prefill's time as a ratio to stock eager (lower is "
            f"faster); compiled with inductor, stock as Transformers compiles it (`fullgraph=False`), patched with "
            f"inputs from `prepare` and `fullgraph=True`. PyTorch {m['torch'].split('+')[0]}, Transformers "
            f"{m['transformers']}, {m['cpus']} CPU cores, {doc['config']['dtype']}. " + reproduce(
                "bench-cpu-whole-compiled.json"))


def render_bench_train() -> str:
    pairs = load("bench-cpu-train.json")["pairs"]
    rows = [(p["model"], SCENARIOS.get(p["scenario"], p["scenario"]), ms(p["stock_ms"]), ms(p["patched_ms"]),
             f"{p['ratio']:.2f}", f"{p['stock_syncs']} → {bold_zero(p['patched_syncs'])}") for p in pairs]
    head = ("model", "scenario", "stock step", "patched step", "patched / stock", "syncs per step")
    return table(head, rows, "llrrrr") + "\n" + reproduce("bench-cpu-train.json")


def render_launch_counts() -> str:
    doc = load("launch_counts.json")
    by = {(r["scenario"], r["variant"]): r for r in doc["rows"]}
    variants = [v for v in dict.fromkeys(r["variant"] for r in doc["rows"]) if v != "stock"]
    rows = []
    for scenario in dict.fromkeys(r["scenario"] for r in doc["rows"]):
        stock = by[(scenario, "stock")]
        rows.append((scenario, stock["launches"], *(by[(scenario, v)]["launches"] for v in variants),
                     f"{stock['attention_calls']} → {by[(scenario, 'grouped')]['attention_calls']}"))
    head = ("input", "stock", *(f"patched `{v}`" for v in variants), "attention calls, stock → `grouped`")
    return (f"{doc['model']} vision tower ({doc['vision_depth']} blocks), kernel launches of one forward:\n\n"
            + table(head, rows, "l" + "r" * (len(variants) + 2)) + "\n" + reproduce("launch_counts.json"))


def render_attention_crossover() -> str:
    doc = load("attention_crossover.json")
    cells = doc["cells"]
    names = doc["grid"]["backends"]

    def cell_time(c, b):
        return c["backends"][b]["ms"]

    rows = []
    for c in cells:
        fastest = min(names, key=lambda b: cell_time(c, b))
        rows.append((c["shape"], f"{c['total']:,} × {c['segments']}",
                     *(f"**{ms(cell_time(c, b))}**" if b == fastest else ms(cell_time(c, b)) for b in names),
                     f"{c['backends']['block_diagonal']['peak_rss_mib']:,.0f} MiB"))
    wins = doc["summary"]["block_diagonal_beats_split_and_grouped"]
    equal = sum(c["backends"]["grouped"].get("equal_to_split", False) for c in cells)
    head = ("shape", "patches × segments", *(f"`{b}`" for b in names), "`block_diagonal` peak memory")
    return (f"`block_diagonal` beats both others in {len(wins)} of {len(cells)} cells; `grouped` is bit-identical to "
            f"`split` in {equal} of {len(cells)}. The fastest of each row is in bold.\n\n"
            + table(head, rows, "llrrrr") + "\n" + reproduce("attention_crossover.json"))


def render_packing() -> str:
    doc = load("packing.json")
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
            + table(("", "padded, stock", "packed, syncfree", "packed / padded"), rows, "lrrr") + "\n"
            + reproduce("packing.json"))
