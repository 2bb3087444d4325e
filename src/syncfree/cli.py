"""The ``syncfree`` command: ``demo`` and ``audit``."""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["main"]

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}


def _add_audit_args(p: argparse.ArgumentParser, model: str, inputs: str, text_layers: int | None) -> None:
    from .inputs import LAYOUT_NAMES
    from .presets import PRESETS

    p.add_argument("--model", default=model,
                   help=f"a preset ({', '.join(PRESETS)}) or a local checkpoint folder (default: {model})")
    p.add_argument("--inputs", default=inputs, choices=LAYOUT_NAMES, help=f"input kind (default: {inputs})")
    p.add_argument("--attn", default="sdpa", help="attention implementation: eager, sdpa, ... (default: sdpa)")
    p.add_argument("--scope", default="full", choices=("vision", "rope", "full"),
                   help="what to run: the vision tower, the rope index, or the whole prefill (default: full)")
    p.add_argument("--text-layers", type=int, default=text_layers,
                   help="shorten the text model to N layers (widths stay real); default: "
                   + ("all" if text_layers is None else str(text_layers)))
    p.add_argument("--dtype", default="float32", choices=sorted(_DTYPES), help="model dtype (default: float32)")
    p.add_argument("--image-side", type=int, default=None,
                   help="image side in pixels (default: 448, or 64 for the tiny preset)")
    p.add_argument("--engine", default="auto", choices=("auto", "emulated", "cuda"),
                   help="auto: the real GPU if there is one, else the emulated device")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    if p.prog.endswith("audit"):
        p.add_argument("--compare", action="store_true",
                       help="audit stock and syncfree-patched forwards side by side")


_LABELS = {
    "stock": "stock Transformers, inputs moved with .to('cuda')",
    "patched": "syncfree.patch, same inputs (one explicit read)",
    "patched+prepare": "syncfree.patch, inputs from syncfree.prepare",
}


def _comparison(reports: dict) -> str:
    rows = [("", "syncs", "blocking copies", "h2d", "d2h", "source lines")]
    for variant, report in reports.items():
        t = report.summary()
        rows.append((_LABELS[variant], str(t["syncs"]), str(t["blocking_copies"]), str(t["h2d"]), str(t["d2h"]),
                     str(t["lines"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def _run(args: argparse.Namespace, title: str, compare: bool) -> int:
    import torch

    from .audit_run import VARIANTS, AuditSpec, run_compare

    spec = AuditSpec(model=args.model, inputs=args.inputs, attn=args.attn, scope=args.scope,
                     text_layers=args.text_layers, dtype=getattr(torch, _DTYPES[args.dtype]),
                     image_side=args.image_side)
    print(f"{title}: {spec.model}, {spec.inputs} inputs, attn={spec.attn}, scope={spec.scope}", flush=True)
    start = time.perf_counter()
    reports, about = run_compare(spec, engine=args.engine, variants=VARIANTS if compare else ("stock",))
    print(f"engine: {about['engine']}; vision depth {about['vision_depth']}, text layers {about['text_layers']}; "
          f"grids {about['grids']}; sequence {about['sequence']}; {time.perf_counter() - start:.1f}s\n")
    if compare:
        print(_comparison(reports) + "\n")
    for variant, report in reports.items():
        if compare:
            print(f"-- {_LABELS[variant]} --")
        print((report.table() if report.events else "(no syncs, no copies)") + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": about, **{v: r.to_dict() for v, r in reports.items()}} if compare
                      else {"run": about, **reports["stock"].to_dict()}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    import dataclasses
    import sys as _sys

    import torch

    from .bench import MODELS, QUICK_MODELS, SCENARIOS, BenchConfig, pairs, run_matrix, table, write_results
    from .bench.varlen import VARLEN, varlen_problem

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this machine has no CUDA device")
    if args.quick:
        cfg = BenchConfig(models=tuple(args.models or QUICK_MODELS), scenarios=tuple(args.scenarios or SCENARIOS),
                          device=device, repeats=args.repeats or 2, budget_s=1.0, scale=0.08, max_frames=4,
                          scopes=tuple(args.scopes), compile=(False, True) if args.compile else (False,),
                          graph_breaks=not args.no_graph_breaks, text_layers=2,
                          deadline_s=args.deadline, keep_going=args.keep_going)
    else:
        attns = tuple(args.attn or (("sdpa", "eager") if device == "cuda" else ("sdpa",)))
        cfg = BenchConfig(models=tuple(args.models or MODELS), scenarios=tuple(args.scenarios or SCENARIOS),
                          scopes=tuple(args.scopes), attns=attns, compile=(False, True) if args.compile else (False,),
                          device=device, repeats=args.repeats or 5, budget_s=args.budget,
                          text_layers=args.text_layers, dtype=_DTYPES[args.dtype],
                          graph_breaks=not args.no_graph_breaks, deadline_s=args.deadline,
                          keep_going=args.keep_going)
    if VARLEN in cfg.attns and varlen_problem(device, cfg.dtype):
        raise ValueError(varlen_problem(device, cfg.dtype))
    unknown = [s for s in cfg.scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    print(f"syncfree bench on {device}: {len(cfg.models)} models x {len(cfg.scenarios)} scenarios x "
          f"{len(cfg.scopes)} scopes x {len(cfg.attns)} attention x {len(cfg.compile)} compile, stock vs patched",
          flush=True)
    tty = _sys.stdout.isatty()

    def progress(line: str) -> None:
        print(("\r\033[K" if tty else "") + line, end="" if tty else "\n", flush=True)

    name = args.name or f"bench-{device}{'-quick' if args.quick else ''}"
    config = dataclasses.asdict(cfg)

    def save(run, plot: bool = False) -> dict:
        # Rewritten after every scenario, so a run stopped by a timeout still leaves its results.
        return write_results(args.out, name, config, run.records, plot=plot, errors=run.errors,
                             not_run=run.not_run)

    run = run_matrix(cfg, progress=progress, on_update=save)
    if tty:
        print()
    paths = save(run, plot=not args.no_plot)
    print("\n" + table(pairs(run.records)))
    for e in run.errors:
        print(f"\nFAILED {e['model']} {e['attn']} {e['scenario'] or '(building the model)'}: {e['error']}")
    if run.not_run:
        print(f"\nnot run (past the {cfg.deadline_s:g} s deadline): "
              + ", ".join(f"{c['model']}/{c['attn']}/{c['scenario']}" for c in run.not_run))
    print("\nwrote " + ", ".join(p for p in paths.values() if p))
    return 1 if run.errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="syncfree", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="stock vs syncfree-patched Qwen3-VL forward, audited (offline, no GPU needed)")
    _add_audit_args(demo, model="qwen3-vl-2b", inputs="mixed", text_layers=2)
    aud = sub.add_parser("audit", help="list every host sync and copy of one forward, by source line")
    _add_audit_args(aud, model="qwen3-vl-tiny", inputs="image", text_layers=None)
    bench = sub.add_parser("bench", help="stock vs patched latency, syncs and graph breaks over the scenario matrix")
    bench.add_argument("--quick", action="store_true", help="tiny models and inputs: a smoke run of under a minute")
    bench.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    bench.add_argument("--models", nargs="+", help="presets or checkpoint folders (default: the real shapes)")
    bench.add_argument("--scenarios", nargs="+", help="scenario names (default: all)")
    bench.add_argument("--attn", nargs="+",
                       help="attention implementations: sdpa, eager, flash_attention_2 (when installed), or varlen "
                            "(PyTorch's flash kernel for the vision tower, CUDA only); default: sdpa, and sdpa and "
                            "eager on cuda")
    bench.add_argument("--compile", action="store_true", help="also time the torch.compile'd vision tower")
    bench.add_argument("--scopes", nargs="+", default=["vision", "full"], choices=("vision", "full"),
                       help="vision tower alone and/or the full prefill (default: both)")
    bench.add_argument("--dtype", default="float32", choices=sorted(_DTYPES), help="model dtype (default float32)")
    bench.add_argument("--repeats", type=int, help="timed runs per variant (default 5; 2 with --quick)")
    bench.add_argument("--budget", type=float, default=20.0, help="seconds per variant before repeats are cut")
    bench.add_argument("--text-layers", type=int, default=2, help="text layers for the full scope (default 2)")
    bench.add_argument("--out", default="benchmarks/results", help="output folder (default benchmarks/results)")
    bench.add_argument("--name", help="file name stem (default bench-<device>[-quick])")
    bench.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    bench.add_argument("--no-graph-breaks", action="store_true",
                       help="skip counting the vision tower's graph breaks (torch._dynamo.explain)")
    bench.add_argument("--deadline", type=float, metavar="SECONDS",
                       help="start no new scenario after this many seconds; the rest are listed as not run")
    bench.add_argument("--keep-going", action="store_true",
                       help="record a failing scenario and go on (the exit status is then 1)")
    args = parser.parse_args(argv)
    if args.command == "bench":
        try:
            return _bench(args)
        except ValueError as err:
            print(f"syncfree bench: error: {err}", file=sys.stderr)
            return 2
    demo_run = args.command == "demo"
    title = "syncfree demo" if demo_run else "syncfree audit"
    try:
        return _run(args, title, compare=demo_run or args.compare)
    except ValueError as err:  # bad model name, sizes, ...: say what, not a traceback
        print(f"syncfree {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
