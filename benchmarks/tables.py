"""The tables README.md and docs/ show, rendered from the recorded results in benchmarks/results.

Each generated table sits in a Markdown file between two markers:

    <!-- begin table: NAME (python benchmarks/tables.py) -->
    ...
    <!-- end table: NAME -->

Run: python benchmarks/tables.py           rewrites every such block from benchmarks/results
     python benchmarks/tables.py --check   changes nothing; exit 1 naming each block that differs

The test suite runs the check (tests/test_docs.py), so a table cannot drift from its data: record new results,
run this script, commit both. Only the standard library is used (no torch), so it runs anywhere in a second.

This file keeps the blocks (which files hold them, which are stale, rewriting them); the renderers that fill them
live in ``doc_tables/``, one module per kind of recorded result.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Callable

# (run as a script or loaded from its path, as the tests and the docs' hook load it: its folder holds the renderers)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from doc_tables import common  # noqa: E402
from doc_tables.census import render_device_work, render_families, render_support  # noqa: E402
from doc_tables.common import DISPLAY, NOT_FAMILIES, ROOT, display_name  # noqa: E402
from doc_tables.conformance import render_hf_tests, render_published_shapes  # noqa: E402
from doc_tables.headlines import render_headlines, render_headlines_full  # noqa: E402
from doc_tables.host_cost import render_emulation_overhead, render_host_cost, render_host_cost_families  # noqa: E402
from doc_tables.speed import (  # noqa: E402
    render_attention_crossover,
    render_bench_compiled,
    render_bench_cpu,
    render_bench_train,
    render_launch_counts,
    render_packing,
    render_whole_compiled,
)
from doc_tables.streams import render_compile_stream, render_compile_stream_fresh_caches  # noqa: E402
from doc_tables.syncs import render_generate_syncs, render_train_steps  # noqa: E402

__all__ = ["DOCUMENTS", "RENDERERS", "DISPLAY", "NOT_FAMILIES", "display_name", "blocks", "render", "stale", "update",
           "main"]

# The Markdown files that may hold generated blocks.
DOCUMENTS = ("README.md", "docs")

_BLOCK = re.compile(r"(<!-- begin table: (?P<name>[\w-]+) \(python benchmarks/tables\.py\) -->\n)(?P<body>.*?)"
                    r"(<!-- end table: (?P=name) -->)", re.S)

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
    parser = argparse.ArgumentParser(description="Render README.md's and docs/'s tables from benchmarks/results.")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its data")
    parser.add_argument("--results", default=common.RESULTS, metavar="DIR",
                        help="the folder the tables render from (default: the recorded benchmarks/results; a "
                             "reproduced run's folder, e.g. results/, which its commands write to)")
    args = parser.parse_args(argv)
    common.RESULTS = os.path.abspath(args.results)  # (read by every renderer when it runs)
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
