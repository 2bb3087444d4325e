"""Cross-check the emulated auditor against the real CUDA engine, model by model, input by input.

For each model and input layout, one forward per variant (stock, patched, patched+prepare) is
audited twice: on the real device here, and on the emulated device in a child process that
cannot see the GPU. Host syncs are compared by source line, and every line where the two
disagree is printed. The two engines run as two child processes side by side; the models are the
tiny presets of every family by default (the sync lines are the code's, not the sizes').

    python benchmarks/gpu/cross_check.py --out OUT/cross_check.json

``--engines emulated emulated`` runs the same plumbing without a GPU (the test suite does that).
Exit status: 0 when every line agrees, 1 when some differ or a child failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

MODELS = ("qwen3-vl-tiny", "qwen3-vl-moe-tiny", "qwen2.5-vl-tiny", "qwen2-vl-tiny")
INPUTS = ("image", "images", "video", "mixed")
VARIANTS = ("stock", "patched", "patched+prepare")

# One child per engine: every (model, inputs) pair, one JSON line each, a failure reported in its line.
CHILD = """
import json, sys, traceback
from syncfree.compare.forward import AuditSpec, run_compare
engine, models, inputs = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
for model in models:
    for kind in inputs:
        try:
            reports, _ = run_compare(AuditSpec(model=model, inputs=kind), engine=engine)
            line = {"lines": {v: [e.line for e in r.syncs] for v, r in reports.items()},
                    "blocking_copies": {v: len(r.blocking_copies) for v, r in reports.items()}}
        except Exception as exc:
            line = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        print(json.dumps({"model": model, "inputs": kind, **line}), flush=True)
"""


def _labels(engines: list[str]) -> list[str]:
    return [e if engines.count(e) == 1 else f"{e}{i + 1}" for i, e in enumerate(engines)]


def _start(engine: str, models, inputs) -> subprocess.Popen:
    env = dict(os.environ)
    if engine == "emulated":
        env["CUDA_VISIBLE_DEVICES"] = ""  # emulate_cuda() refuses to run beside a real GPU
    return subprocess.Popen([sys.executable, "-c", CHILD, engine, ",".join(models), ",".join(inputs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _collect(proc: subprocess.Popen, timeout: float) -> tuple[dict, str]:
    """{(model, inputs): line} from a child, and its stderr's tail; a child past the timeout is killed."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n(stopped after {timeout:g} s)"
    lines = {}
    for text in out.splitlines():
        if text.startswith("{"):
            d = json.loads(text)
            lines[d["model"], d["inputs"]] = d
    return lines, err[-3000:]


def compare(first: dict | None, second: dict | None) -> dict:
    """Per variant: the sync totals of both engines and the lines whose counts differ."""
    out = {}
    for variant in VARIANTS:
        a = Counter((first or {}).get("lines", {}).get(variant, []))
        b = Counter((second or {}).get("lines", {}).get(variant, []))
        differ = {line: [a.get(line, 0), b.get(line, 0)] for line in sorted(set(a) | set(b))
                  if a.get(line, 0) != b.get(line, 0)}
        out[variant] = {"syncs": [sum(a.values()), sum(b.values())], "differ": differ}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--inputs", nargs="+", default=list(INPUTS))
    parser.add_argument("--engines", nargs=2, default=["cuda", "emulated"], choices=("cuda", "emulated"))
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for each engine's child")
    args = parser.parse_args(argv)
    labels = _labels(args.engines)
    if "cuda" in args.engines:
        import torch

        if not torch.cuda.is_available():
            print("cross_check: the cuda engine needs a CUDA device and this machine has none; without one, "
                  "--engines emulated emulated runs the same plumbing", file=sys.stderr)
            return 2
    procs = [_start(e, args.models, args.inputs) for e in args.engines]  # side by side
    collected = [_collect(p, args.timeout) for p in procs]
    results, differ, failed = [], 0, 0
    for model in args.models:
        for kind in args.inputs:
            got = [c[0].get((model, kind)) for c in collected]
            errors = {lab: (g or {}).get("error", "no result (child failed or stopped)")
                      for lab, g in zip(labels, got) if g is None or "error" in g}
            entry = {"model": model, "inputs": kind, "engines": labels, "errors": errors,
                     "blocking_copies": {lab: (g or {}).get("blocking_copies") for lab, g in zip(labels, got)},
                     "variants": compare(*got)}
            results.append(entry)
            failed += bool(errors)
            for variant, v in entry["variants"].items():
                differ += len(v["differ"])
                state = "FAILED" if errors else ("agree" if not v["differ"] else f"{len(v['differ'])} lines differ")
                shown = ["n/a" if lab in errors else f"{n:4d}" for lab, n in zip(labels, v["syncs"])]
                print(f"{model:18s} {kind:7s} {variant:16s} syncs {labels[0]}={shown[0]:>4s} "
                      f"{labels[1]}={shown[1]:>4s}  {state}")
                for line, (a, b) in v["differ"].items():
                    print(f"    {line}: {labels[0]} {a}, {labels[1]} {b}")
            for lab, e in errors.items():
                print(f"    {lab}: {e}")
    for lab, (_, err) in zip(labels, collected):
        if failed and err.strip():
            print(f"--- {lab} child stderr (tail) ---\n{err}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"engines": labels, "results": results, "lines_that_differ": differ, "failed": failed,
                   "stderr": {lab: err for lab, (_, err) in zip(labels, collected)}}, f, indent=2)
    print(f"wrote {args.out}: {differ} lines differ, {failed} pairs failed")
    return 0 if differ == 0 and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
