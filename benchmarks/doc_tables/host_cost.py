"""docs/benchmarks.md's host-cost tables: what prepare() costs the host, and the emulated device's overhead."""

from __future__ import annotations

from .common import load, reproduce, table

__all__ = ["render_emulation_overhead", "render_host_cost", "render_host_cost_families"]


def render_host_cost() -> str:
    now = load("host_cost.json")
    before = {(r["model"], r["layout"]): r for r in load("host_cost_before.json")["rows"]}
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
    under_load = load("host_cost_under_load.json")
    before_load, after_load = (next(v for k, v in under_load.items() if k.startswith(w)) for w in ("before", "after"))
    loaded = "; ".join(
        f"{b['model']}: {b['ms_1_thread']:.1f} → {a['ms_1_thread']:.1f} ms with 1 thread, "
        f"{b['ms_default_threads']:.1f} → {a['ms_default_threads']:.1f} ms with {now['default_threads']} threads"
        for b, a in zip(before_load["rows"], after_load["rows"]))
    return (f"{now['method']}; 1 thread, {now['cpus']} CPU cores. The earlier plan made Qwen2.5-VL's window table "
            "window by window in Python and uploaded int64 positions and one checksum weight per token "
            "(`host_cost_before.json`).\n\n"
            + table(head, rows, "llrrrrr") + "\n" + reproduce("host_cost.json")
            + f"\nWith both cores kept busy by two other processes, the largest batch, when the per-patch tables moved "
            f"to the device (host tables → device tables): {loaded} (`host_cost_under_load.json`).\n")


def render_host_cost_families() -> str:
    """docs/benchmarks.md: every fully supported family's plan at its largest standard layout, before and after."""
    now = load("host_cost_families.json")
    before = {r["family"]: r for r in load("host_cost_families_before.json")["families"]}
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
            + table(head, rows, "lrrrrr") + "\n" + reproduce("host_cost_families.json"))


def render_emulation_overhead() -> str:
    doc = load("emulation_overhead.json")
    return (f"{doc['model']} vision tower, one {doc['image'][0]}×{doc['image'][1]} image, median of {doc['repeats']}: "
            f"plain CPU {doc['plain_median_s']:.2f} s, emulated {doc['emulated_median_s']:.2f} s "
            f"(**{doc['ratio']:.2f}×**), outputs bit-identical: {'yes' if doc['bit_identical'] else '**no**'}; "
            f"{doc['syncs_recorded']} syncs recorded.\n" + reproduce("emulation_overhead.json"))
