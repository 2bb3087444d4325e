"""What every table shares: where the recorded results are, each family's display name, the command that
recorded each file and the versions it ran on, and the Markdown table and number formats."""

from __future__ import annotations

import ast
import glob
import json
import os

__all__ = ["COMMANDS", "DISPLAY", "NOT_FAMILIES", "RESULTS", "ROOT", "SCENARIOS", "WHY_LEFT", "bold_if_less",
           "bold_zero", "load", "ms", "reproduce", "some_zero", "span", "table", "versions_note", "versions_of",
           "display_name"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")

# Model types as their authors write them (a model type missing here is shown as it is): each family group declares its
# own (``GROUP = FamilyGroup(..., display={...})`` in src/syncfree/families/<group>/__init__.py, read here from the
# source: the tables import neither syncfree nor torch); these are census rows of model types no group declares.
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
WHY_LEFT = {
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

SCENARIOS = {
    "image-448": "one 448 px image", "image-896": "one 896 px image", "image-1344": "one 1344 px image",
    "images-8x224": "8 images of 224 px", "video-16x448": "a 16-frame 448 px video",
    "image+video": "an image and a video", "batch-4": "4 requests, 1-4 images each",
}


def display_name(model_type: str) -> str:
    # (an Omni family's thinker, the model type a benchmark compiles, shows as its family: "... (thinker)")
    return DISPLAY.get(model_type, DISPLAY.get(model_type.removesuffix("_thinker"), model_type))


def load(name: str):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def table(head: tuple[str, ...], rows: list[tuple], align: str = "") -> str:
    """A Markdown table; ``align`` has one letter per column, ``r`` for right-aligned (default left)."""
    align = align.ljust(len(head), "l")
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    lines = ["| " + " | ".join(head) + " |", rule]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def span(values) -> str:
    values = sorted(set(values))
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms"


def bold_zero(value) -> str:
    return "**0**" if str(value) == "0" else str(value)


def some_zero(values: list[int]) -> str:
    """'**0** in 22 of 33 (2–4 in the others)', or '**0**' where all are."""
    others = [v for v in values if v]
    if not others:
        return "**0**"
    return f"**0** in {len(values) - len(others)} of {len(values)} ({span(others)} in the others)"


def reproduce(name: str) -> str:
    """Where a table's numbers were recorded, by which command, on which versions."""
    return f"Recorded in `benchmarks/results/{name}` by `{COMMANDS[name]}`{versions_note(name)}.\n"


def versions_of(name: str) -> str:
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


def versions_note(pattern: str) -> str:
    """`` (PyTorch X, Transformers Y)`` of the recorded files matching ``pattern``, where they record them."""
    versions = versions_of(pattern)
    return f" ({versions})" if versions else ""


def bold_if_less(form: str, value, than) -> str:
    text = form.format(value)
    return f"**{text}**" if value < than else text
