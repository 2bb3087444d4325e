"""Compiling for a stream of layouts, stock against syncfree, side by side in one run.

Each family's tiny model is fed the same stream of varied batches (``syncfree.inputs.stream_layouts``: images of
several counts and sizes, videos, text-only rows, padding; ``audio_stream_layouts``' clips of varied lengths for an
audio-only family; with clips too for an Omni thinker) twice: stock under ``torch.compile(model)`` (graph breaks
allowed, as it must be: stock's data-dependent reads break its graph), and patched under
``torch.compile(model, fullgraph=True)`` with each batch from ``syncfree.prepare``. For each: the graphs Dynamo made
(its ``unique_graphs``), the seconds spent compiling (Dynamo's ``_compile.compile_inner``, the backend's compile
inside it; both sides compile cold: Inductor's caches off, or with ``--inductor-caches fresh`` empty at the start of
each side and kept through its stream), the wall time of the whole stream, and how many C++ builds Inductor made and
the seconds they took (one per kernel on a CPU: most of a whole-graph compile there).

    python benchmarks/compile_stream.py --families qwen2_5_vl qwen3_vl glm4v --batches 16 --out results/compile_stream.json

With ``--buckets`` a third run: patched, each batch padded up to a ``syncfree.Buckets`` bucket (right-padded, images
only), the mode CUDA graphs need on a GPU (``--device cuda --mode reduce-overhead``). ``--passes 2`` runs the stream
again after the compiles and reports its real tokens per second (the steady state a long run sees). ``--stages`` also
records where each side's compile seconds went, from Dynamo's and Inductor's own timers (``STAGES``), and each
compile's seconds in order (a whole graph's, or a piece's between graph breaks).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time

import torch
import torch._inductor.config as inductor_config
from tqdm import tqdm

import syncfree
from syncfree.census.inputs import image_unit
from syncfree.census.run import discover, patched_type
from syncfree.families import PRESETS
from syncfree.inputs import audio_stream_layouts, is_audio_only, is_omni, stream_batch, stream_layouts
from syncfree.plan.spec import layout_of
from syncfree.presets import build_model


def _tiny_preset(family: str) -> str:
    return next(name for name, p in PRESETS.items() if p.values["model_type"] == family and name.endswith("-tiny"))


# The compile stages ``--stages`` reports, as Dynamo's timers name them. They nest and overlap (C++ builds run in
# Inductor's worker threads while its code generation goes on), so they do not add up to ``compile_s``.
STAGES = {
    "bytecode_tracing": "Dynamo tracing the Python bytecode",
    "aot_collect_metadata": "AOTAutograd's first pass over the graph",
    "GraphLowering.run": "Inductor lowering the graph to its IR",
    "Scheduler.__init__": "Inductor fusing the IR into kernels",
    "GraphLowering.codegen": "Inductor writing the kernels' and the wrapper's code",
    "compile_file": "the C++ builds",
    "async_compile.wait": "waiting for the builds after code generation",
}


def _compile_seconds() -> float:
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("_compile.compile_inner", []))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _run(model, batches: list[dict], patched: bool, backend: str, device: str = "cpu", mode: str | None = None,
         buckets=None, passes: int = 1, stages: bool = False, caches: str = "off") -> dict:
    torch._dynamo.reset()
    from torch._dynamo.utils import compilation_time_metrics, counters

    compilation_time_metrics.clear()
    counters.clear()
    compiled = torch.compile(model, fullgraph=patched, backend=backend, mode=mode)
    with _cold_caches(caches):
        return _stream(compiled, model, batches, patched, device, buckets, passes, stages)


def _cold_caches(caches: str):
    """``fresh``: Inductor's caches start empty for this side, in a new directory, and serve what the side compiled
    to its later graphs (as a first run of a new job has them); ``off``: no cache at all, so a kernel that two graphs
    share is built twice (``force_disable_caches``, set in ``main``)."""
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache  # (the older name before torch 2.9)
    return fresh() if caches == "fresh" else contextlib.nullcontext()


def _stream(compiled, model, batches, patched, device, buckets, passes, stages) -> dict:
    from torch._dynamo.utils import compilation_time_metrics, counters

    from syncfree.families import batch_to

    def inputs(batch: dict) -> dict:
        return syncfree.prepare(batch, device, model, buckets=buckets) if patched else batch_to(batch, device)

    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    found = {}
    with torch.no_grad():
        for done in range(passes):
            start = time.perf_counter()
            for batch in batches:
                compiled(**inputs(batch))
            _sync(device)
            wall = time.perf_counter() - start
            if done == 0:
                builds = compilation_time_metrics.get("compile_file", [])  # (Inductor's C++ builds, one per kernel)
                found = {"graphs": int(counters["stats"]["unique_graphs"]), "compile_s": round(_compile_seconds(), 2),
                         "wall_s": round(wall, 2), "cpp_builds": len(builds), "cpp_build_s": round(sum(builds), 2)}
                if stages:
                    found["stages_s"] = {name: round(sum(compilation_time_metrics.get(name, [])), 2) for name in STAGES}
                    found["each_compile_s"] = [round(t, 2) for t in compilation_time_metrics["_compile.compile_inner"]]
            else:
                found["tokens_per_s"] = round(tokens / wall, 1)
    return found


def measure(family: str, count: int, backend: str, seed: int, device: str = "cpu", dtype: str = "float32",
            mode: str | None = None, buckets: bool = False, passes: int = 1, stages: bool = False,
            caches: str = "off", partial=lambda row: None) -> dict:
    """The row of ``family``; ``partial(row)`` after each run (a caller cut short keeps what was measured). With
    ``buckets`` the patched runs come first (what a GPU cell is for), stock last."""
    preset = _tiny_preset(family)
    model = build_model(preset, dtype=getattr(torch, dtype), device=device).eval()
    videos = getattr(model.config, "video_token_id", None) is not None and not buckets
    side = "right" if buckets else "left"  # (buckets take right-padded batches; images only)
    # (an audio-only family's stream varies its clips instead of images; an Omni thinker's has clips too)
    layouts = audio_stream_layouts(count, seed=seed) if is_audio_only(model.config) else \
        stream_layouts(count, image_unit(model.config), videos=videos, seed=seed,
                       audio=is_omni(model.config) and not buckets)
    # (as the family's processor takes them: images only, or one image per sample, where it refuses others)
    batches = [stream_batch(model.config, samples, pad_token_id=PRESETS[preset].pad_token_id, padding_side=side)
               for samples in layouts]
    run = dict(backend=backend, device=device, mode=mode, passes=passes, stages=stages, caches=caches)
    row = {"family": family, "preset": preset, "batches": count}
    variants = {"stock": None, "patched": None}
    if buckets:
        variants = {"patched+buckets": syncfree.Buckets.powers_of_two(512, 4096, 16, smallest_tokens=32,
                                                                      smallest_patches=64), "patched": None,
                    "stock": None}
    for name, chosen in variants.items():
        if name == "stock":
            syncfree.unpatch(model)
            row[name] = _run(model, batches, patched=False, **run)
        else:
            syncfree.patch(model)
            try:
                row[name] = _run(model, batches, patched=True, buckets=chosen, **run)
            except Exception as error:  # (recorded, not hidden: the row says which batch's compile failed and why)
                row[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
        partial(row)
    del model
    gc.collect()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", help="model types (default: every family that traces whole)")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--backend", default="inductor", help="the torch.compile backend (default: inductor)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--mode", help="torch.compile's mode (reduce-overhead: CUDA graphs, on a GPU)")
    parser.add_argument("--buckets", action="store_true", help="also run patched with syncfree.Buckets")
    parser.add_argument("--passes", type=int, default=1, help="2: the stream again, timed (tokens per second)")
    parser.add_argument("--stages", action="store_true",
                        help="also record each side's seconds per compile stage and per compile")
    parser.add_argument("--inductor-caches", choices=("off", "fresh"), default="off",
                        help="off: no Inductor cache; fresh: empty caches for each side, kept through its stream")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--append", action="store_true",
                        help="keep --out's rows of other families (recorded with the same versions and settings)")
    args = parser.parse_args(argv)
    types = [patched_type(f) for f in discover()]  # (an Omni model's census name is its folder's)
    families = args.families or [f for f in types if layout_of(f) is not None and layout_of(f).one_graph]
    torch.set_num_threads(1)
    # (cold compiles on both sides: Inductor's on-disk caches would serve one side what an earlier run compiled; with
    # fresh caches each side has its own new directory, ``_cold_caches``)
    inductor_config.force_disable_caches = args.inductor_caches == "off"
    import transformers

    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "backend": args.backend,
            "threads": 1, "seed": args.seed, "device": args.device, "dtype": args.dtype, "mode": args.mode,
            "inductor_caches": args.inductor_caches}
    rows = []
    kept = _kept_rows(args.out, meta, families) if args.append else []

    def write(partial: dict | None = None) -> None:
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": kept + rows + ([partial] if partial else [])}, f, indent=1)

    for family in tqdm(families, desc="families", file=sys.stderr):
        rows.append(measure(family, args.batches, args.backend, args.seed, args.device, args.dtype, args.mode,
                            args.buckets, args.passes, args.stages, args.inductor_caches, partial=write))
        print(json.dumps(rows[-1]), flush=True)
        write()
    return 0


def _kept_rows(path: str | None, meta: dict, families: list[str]) -> list[dict]:
    """The rows already in ``path`` for families not measured now; refused where they were recorded otherwise (rows
    side by side in one table must share versions, backend and settings)."""
    if not path:
        raise SystemExit("--append needs --out")
    try:
        with open(path) as f:
            recorded = json.load(f)
    except FileNotFoundError:
        return []
    if recorded.get("meta") != meta:
        raise SystemExit(f"--append: {path} was recorded with {recorded.get('meta')}, not {meta}; record it anew")
    return [row for row in recorded["rows"] if row["family"] not in families]


if __name__ == "__main__":
    sys.exit(main())
