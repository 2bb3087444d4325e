"""docs/benchmarks.md's sync counts beyond the census: generate() and training steps, by phase."""

from __future__ import annotations

import glob
import os

from . import common
from .common import bold_zero, load, reproduce, span, table, versions_note

__all__ = ["render_generate_syncs", "render_train_steps"]


def render_generate_syncs() -> str:
    doc = load("generate_syncs.json")
    rows = [(r["cache"], r["variant"], r["prefill"], span(r["decode_steps"]), r["outside_forwards"], r["total"],
             "yes" if r["same_ids_as_stock"] else "**no**") for r in doc["rows"]]
    run = doc["run"]
    head = ("cache", "variant", "prefill forward", "each decode step", "`generate()` outside the forwards", "total",
            "ids equal stock's")
    return (f"{run['model']} shapes, text model cut to {run['text_layers']} layers, `{run['inputs']}` inputs, "
            f"{run['new_tokens']} new tokens, emulated device, Transformers {run['transformers']}.\n\n"
            + table(head, rows, "llrrrrl") + "\n" + reproduce("generate_syncs.json"))


def _phase_row(label: str, doc: dict, variant: str) -> tuple:
    phases, summary = doc[variant]["phases"], doc[variant]["summary"]
    return (label, *(phases.get(p, {"syncs": 0})["syncs"] for p in ("forward", "recompute", "backward", "optimizer")),
            bold_zero(summary["syncs"]), summary["blocking_copies"])


def render_train_steps() -> str:
    rows = []
    for path in sorted(glob.glob(os.path.join(common.RESULTS, "train-*.json"))):
        doc = load(os.path.basename(path))
        run = doc["run"]
        label = run["model"] + (f", gradient checkpointing ({run['grad_ckpt']})" if run.get("grad_ckpt") else "")
        label += f", {run.get('optimizer', 'adamw')}" if run.get("optimizer") else ""
        for variant in run["variants"]:
            rows.append(_phase_row(f"{label}: {variant}", doc, variant))
    head = ("model: variant", "forward", "recompute", "backward", "optimizer", "total", "blocking copies")
    return (table(head, rows, "lrrrrrr") + "\nRecorded in `benchmarks/results/train-*.json` by `syncfree audit "
            "--train --model MODEL --inputs image --text-layers 2 --dtype bfloat16 [--grad-ckpt non-reentrant] "
            "[--optimizer sgd] --json PATH`" + versions_note("train-*.json") + ".\n")
