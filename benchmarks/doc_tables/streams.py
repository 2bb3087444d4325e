"""docs/benchmarks.md's compile-stream tables: one compiled model over a stream of layouts, stock against patched."""

from __future__ import annotations

from .common import bold_if_less, display_name, load, reproduce, table

__all__ = ["render_compile_stream", "render_compile_stream_fresh_caches"]


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
    return [f"{form.format(get(stock))} → " + (after or bold_if_less(form, get(patched), get(stock)))
            for get, form in keys]


def render_compile_stream() -> str:
    """docs/benchmarks.md: one compiled model over a stream of varied layouts, stock against patched."""
    doc = load("compile_stream.json")
    keys = [(lambda side, k=k: side[k], form) for k, form in (("graphs", "{}"), ("compile_s", "{:.1f}"),
                                                             ("wall_s", "{:.1f}"))]
    rows = [(display_name(row["family"]), row["batches"], *_stream_cells(row["stock"], row["patched"], keys))
            for row in doc["rows"]]
    head = ("family", "batches", "graphs, stock → patched", "compile s, stock → patched", "whole stream s")
    return _stream_note(doc.get("meta", {})) + table(head, rows, "lrrrr") + "\n" + reproduce("compile_stream.json")


def render_compile_stream_fresh_caches() -> str:
    """docs/benchmarks.md: the same, with Inductor's caches as a new job has them, and where the seconds went."""
    name = "compile_stream_fresh_caches.json"
    doc = load(name)
    keys = [(lambda side: side["graphs"], "{}"), (lambda side: side["compile_s"], "{:.1f}"),
            (lambda side: side["stages_s"]["bytecode_tracing"], "{:.1f}"),
            (lambda side: side["stages_s"]["aot_collect_metadata"], "{:.1f}"),
            (lambda side: side["stages_s"]["GraphLowering.codegen"], "{:.1f}"),
            (lambda side: side["cpp_build_s"], "{:.1f}")]
    rows = [(display_name(row["family"]), *_stream_cells(row["stock"], row["patched"], keys))
            for row in sorted(doc["rows"], key=lambda row: display_name(row["family"]))]
    head = ("family", "graphs", "compile s", "Dynamo tracing s", "AOTAutograd metadata s", "Inductor code generation s",
            "C++ builds s")
    return _stream_note(doc.get("meta", {})) + table(head, rows, "lrrrrrr") + "\n" + reproduce(name)
