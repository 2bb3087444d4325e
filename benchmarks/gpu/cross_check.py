"""Cross-check the emulated auditor against the real CUDA engine, scenario by scenario.

For each scenario (at its smallest pixel size: the syncs depend on the layout) and each
variant (stock, patched, patched+prepare), count host syncs by source line with the real
device here and with the emulated device in a child process that cannot see the GPU, and
print every line where the two disagree. Writes the comparison as JSON.

    python benchmarks/gpu/cross_check.py --out OUT/cross_check.json [--model qwen3-vl-2b]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

CHILD = """
import json, sys
from syncfree.audit_run import AuditSpec, run_compare
from syncfree.bench.scenarios import SCENARIOS
from syncfree.inputs import build_inputs
model, scenario, engine = sys.argv[1:4]
import syncfree.audit_run as ar
reports, _ = ar.run_compare(AuditSpec(model=model, inputs=scenario, text_layers=2), engine=engine)
print(json.dumps({v: [e.line for e in r.syncs] for v, r in reports.items()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="qwen3-vl-2b")
    parser.add_argument("--inputs", nargs="+", default=["image", "images", "video", "mixed"])
    args = parser.parse_args()
    results, disagreements = {}, 0
    for kind in args.inputs:
        counts = {}
        for engine, env in (("cuda", dict(os.environ)), ("emulated", {**os.environ, "CUDA_VISIBLE_DEVICES": ""})):
            out = subprocess.run([sys.executable, "-c", CHILD, args.model, kind, engine], capture_output=True,
                                 text=True, env=env, timeout=600)
            if out.returncode != 0:
                print(f"{kind} {engine}: failed\n{out.stderr[-2000:]}")
                counts[engine] = None
                continue
            counts[engine] = {v: Counter(lines) for v, lines in json.loads(out.stdout.strip().splitlines()[-1]).items()}
        results[kind] = {}
        for variant in ("stock", "patched", "patched+prepare"):
            real = (counts.get("cuda") or {}).get(variant, Counter())
            emulated = (counts.get("emulated") or {}).get(variant, Counter())
            diff = {line: {"cuda": real.get(line, 0), "emulated": emulated.get(line, 0)}
                    for line in sorted(set(real) | set(emulated)) if real.get(line, 0) != emulated.get(line, 0)}
            results[kind][variant] = {"cuda": sum(real.values()), "emulated": sum(emulated.values()), "differ": diff}
            disagreements += len(diff)
            print(f"{kind:8s} {variant:16s} syncs cuda={sum(real.values()):4d} emulated={sum(emulated.values()):4d}"
                  f"  {'agree' if not diff else f'{len(diff)} lines differ'}")
            for line, c in diff.items():
                print(f"    {line}: cuda {c['cuda']}, emulated {c['emulated']}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "results": results, "lines_that_differ": disagreements}, f, indent=2)
    print(f"wrote {args.out}: {disagreements} lines differ")


if __name__ == "__main__":
    main()
