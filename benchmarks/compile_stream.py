"""Compiling for a stream of layouts, stock against syncfree, side by side in one run.

Each family's tiny model is fed the same stream of varied batches (``syncfree.inputs.stream_layouts``: images of
several counts and sizes, videos, text-only rows, padding) twice: stock under ``torch.compile(model)`` (graph breaks
allowed, as it must be: stock's data-dependent reads break its graph), and patched under
``torch.compile(model, fullgraph=True)`` with each batch from ``syncfree.prepare``. For each: the graphs Dynamo made
(its ``unique_graphs``), the seconds spent compiling (Dynamo's ``_compile.compile_inner``, the backend's compile
inside it) and the wall time of the whole stream.

    python benchmarks/compile_stream.py --families qwen2_5_vl qwen3_vl glm4v --batches 16 --out results/compile_stream.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import torch
from tqdm import tqdm

import syncfree
from syncfree.census.inputs import image_unit
from syncfree.census.run import discover
from syncfree.families import FAMILIES, PRESETS
from syncfree.inputs import processor_batch, stream_layouts
from syncfree.plan.spec import layout_of
from syncfree.presets import build_model


def _tiny_preset(family: str) -> str:
    return next(name for name, p in PRESETS.items() if p.values["model_type"] == family and name.endswith("-tiny"))


def _compile_seconds() -> float:
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("_compile.compile_inner", []))


def _run(model, batches: list[dict], patched: bool, backend: str) -> dict:
    torch._dynamo.reset()
    from torch._dynamo.utils import compilation_time_metrics, counters

    compilation_time_metrics.clear()
    counters.clear()
    compiled = torch.compile(model, fullgraph=patched, backend=backend)
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            compiled(**(syncfree.prepare(batch, "cpu", model) if patched else batch))
    wall = time.perf_counter() - start
    return {"graphs": int(counters["stats"]["unique_graphs"]), "compile_s": round(_compile_seconds(), 2),
            "wall_s": round(wall, 2)}


def measure(family: str, count: int, backend: str, seed: int) -> dict:
    preset = _tiny_preset(family)
    model = build_model(preset).eval()
    videos = getattr(model.config, "video_token_id", None) is not None
    batches = [processor_batch(model.config, samples, pad_token_id=PRESETS[preset].pad_token_id)
               for samples in stream_layouts(count, image_unit(model.config), videos=videos, seed=seed)]
    stock = _run(model, batches, patched=False, backend=backend)
    syncfree.patch(model)
    try:
        patched = _run(model, batches, patched=True, backend=backend)
    except Exception as error:  # (recorded, not hidden: the row says which batch's compile failed and why)
        patched = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    del model
    gc.collect()
    return {"family": family, "preset": preset, "batches": count, "stock": stock, "patched": patched}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", help="model types (default: every family that traces whole)")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--backend", default="inductor", help="the torch.compile backend (default: inductor)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    families = args.families or [f for f in discover() if f in FAMILIES and layout_of(f) is not None
                                 and layout_of(f).one_graph]
    torch.set_num_threads(1)
    rows = []
    for family in tqdm(families, desc="families", file=sys.stderr):
        rows.append(measure(family, args.batches, args.backend, args.seed))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        import transformers

        meta = {"torch": torch.__version__, "transformers": transformers.__version__, "backend": args.backend,
                "threads": 1, "seed": args.seed}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
