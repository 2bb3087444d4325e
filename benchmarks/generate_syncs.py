"""Host syncs of ``generate()`` with a dynamic and a static cache, stock vs patched, by phase (emulated device).

    python benchmarks/generate_syncs.py [--model qwen3-vl-2b] [--inputs mixed] [--new-tokens 4]

Phases: the prefill forward, each decode-step forward, and everything ``generate()`` does outside
the model's forward (its own bookkeeping, stopping criteria, and in Transformers >= 5.24 the vision
encoder, which generate runs before the prefill). Writes generate_syncs.json to $TMPDIR/syncfree-results
(``--out benchmarks/results/generate_syncs.json`` records it) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

import syncfree
from syncfree.audit import audit, emulate_cuda
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import PRESETS, build_model


def _generate_by_phase(model, make_kwargs, options: dict, new_tokens: int) -> dict:
    marks: list[int] = []
    report = None
    hooks = [model.register_forward_pre_hook(lambda m, a: marks.append(len(report.events))),
             model.register_forward_hook(lambda m, a, o: marks.append(len(report.events)))]
    try:
        with emulate_cuda(), torch.no_grad():
            model.to("cuda")
            kwargs = make_kwargs()
            with audit() as report:
                ids = model.generate(**kwargs, max_new_tokens=new_tokens, do_sample=False, **options)
            ids = ids.cpu()
            model.to("cpu")
    finally:
        for h in hooks:
            h.remove()
    waits = [e.waits for e in report.events]
    forwards = [sum(waits[a:b]) for a, b in zip(marks[::2], marks[1::2])]
    return {"prefill": forwards[0], "decode_steps": forwards[1:], "outside_forwards": sum(waits) - sum(forwards),
            "total": sum(waits), "ids": ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-vl-2b", choices=list(PRESETS))
    parser.add_argument("--inputs", default="mixed")
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "syncfree-results", "generate_syncs.json"),
                        help="where to write (default: the temp folder; the recorded run: benchmarks/results/)")
    args = parser.parse_args()

    import transformers

    stock = build_model(args.model, text_layers=args.text_layers)
    patched = syncfree.patch(build_model(args.model, text_layers=args.text_layers))
    config = stock.config
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    side = 64 if args.model.endswith("-tiny") else 448
    batch = build_inputs(config, named_layout(args.inputs, side, unit), pad_token_id=PRESETS[args.model].pad_token_id)
    variants = {
        "stock": (stock, lambda: {k: v.to("cuda") for k, v in batch.items()}),
        "patched": (patched, lambda: {k: v.to("cuda") for k, v in batch.items()}),
        "patched+prepare": (patched, lambda: syncfree.prepare(batch, "cuda", patched)),
    }
    rows = []
    start = time.perf_counter()
    for cache, options in (("dynamic", {}), ("static", {"cache_implementation": "static"})):
        reference = None
        for name, (model, make) in variants.items():
            print(f"{cache} cache, {name} ...", flush=True)
            result = _generate_by_phase(model, make, options, args.new_tokens)
            ids = result.pop("ids")
            reference = ids if reference is None else reference
            rows.append({"cache": cache, "variant": name, **result, "same_ids_as_stock": bool(torch.equal(ids, reference))})
    about = {"model": args.model, "inputs": args.inputs, "text_layers": args.text_layers, "new_tokens": args.new_tokens,
             "grids": {k: v.tolist() for k, v in batch.items() if k.endswith("grid_thw")},
             "torch": torch.__version__, "transformers": transformers.__version__,
             "seconds": round(time.perf_counter() - start, 1)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"run": about, "rows": rows}, f, indent=2)
    print(f"\n{args.model}, {args.inputs} inputs, {args.new_tokens} new tokens, Transformers {transformers.__version__}:\n")
    print("| cache | variant | prefill forward | each decode step | generate() outside the forwards | total |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        steps = sorted(set(r["decode_steps"]))
        print(f"| {r['cache']} | {r['variant']} | {r['prefill']} | {'/'.join(map(str, steps))} | "
              f"{r['outside_forwards']} | {r['total']} |")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
