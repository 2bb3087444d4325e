"""The vision tower's attention backends and bucketed CUDA graphs, timed on a GPU (rehearsable on the CPU).

Qwen3-VL-8B vision shape in bfloat16, three inputs (one 448 px image, 8 images of 224 px, a 32-frame
448 px video), five variants: stock, patched ``split``, patched ``grouped``, patched ``varlen``
(PyTorch's flash kernel) and ``compile_vision`` (one graph per bucket, CUDA graphs). Per cell: latency
(median of CUDA-event timings), and from one profiled run the GPU-busy fraction and the kernel count.
The JSON is rewritten after every cell, and ``--deadline`` stops starting new cells, so a run cut short
keeps what it measured.

    python benchmarks/gpu/vision_backends.py --out OUT/vision_backends.json            # on the GPU
    python benchmarks/gpu/vision_backends.py --device cpu --model qwen3-vl-tiny --quick  # a rehearsal
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import traceback

import torch

import syncfree
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.presets import build_vision_model, load_config

SCENARIOS = {"image-448": [Text(4), Image(448, 448), Text(4)],
             "images-8x224": [Text(2)] + [x for _ in range(8) for x in (Image(224, 224), Text(1))],
             "video-32x448": [Text(4), Video(32, 448, 448), Text(4)]}
VARIANTS = ("stock", "split", "grouped", "varlen", "buckets")


def _timed(fn, device: str, repeats: int) -> list[float]:
    """Milliseconds per call after a warm-up (for the bucketed tower: its compile and graph capture)."""
    from syncfree.bench.runner import time_calls

    return time_calls(fn, device, repeats, budget_s=1e9)  # every repeat: a cell here is short


def _kernels(fn) -> dict:
    from syncfree.bench.gpu_metrics import profile_forward

    return profile_forward(fn)


def _tower(stock, variant: str, device: str, quick: bool):
    if variant == "stock":
        return stock
    if variant == "buckets":
        tower = syncfree.patch(copy.deepcopy(stock))
        return syncfree.compile_vision(tower, buckets=(64, 256, 1024) if quick else (1024, 2048, 16384),
                                       backend=None if device == "cuda" else "eager")
    return syncfree.patch(copy.deepcopy(stock), vision_attention=variant)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-vl-8b")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--deadline", type=float, default=100.0, help="seconds: start no new cell after this")
    parser.add_argument("--quick", action="store_true", help="small inputs (a CPU rehearsal)")
    parser.add_argument("--out", default="vision_backends.json")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    from syncfree.rewrite.attention import varlen_available

    stock = build_vision_model(args.model, dtype=dtype).to(args.device)
    unit = stock.config.patch_size * stock.config.spatial_merge_size
    scale = 1 / 7 if args.quick else 1.0  # 448 px -> 64 px in a rehearsal
    result = {"model": args.model, "device": args.device, "dtype": args.dtype, "torch": torch.__version__,
              "cells": [], "errors": [], "not_run": []}
    start = time.perf_counter()
    config = load_config(args.model)
    inputs = {}
    for scenario, items in SCENARIOS.items():
        batch = build_inputs(config, [[_scaled(x, unit, scale, args.quick) for x in items]])
        kind = "pixel_values" if "pixel_values" in batch else "pixel_values_videos"
        inputs[scenario] = (batch[kind].to(args.device, dtype), batch["image_grid_thw" if kind == "pixel_values"
                                                                       else "video_grid_thw"])
    # Variant by variant, the bucketed compile last: a deadline cuts the most expensive cells first.
    for variant in VARIANTS:
        tower = None
        for scenario, (pixels, grid) in inputs.items():
            if time.perf_counter() - start > args.deadline:
                result["not_run"].append(f"{scenario}/{variant}")
                continue
            if variant == "varlen" and not (args.device == "cuda" and varlen_available() and args.dtype != "float32"):
                result["not_run"].append(f"{scenario}/{variant} (needs CUDA, PyTorch >= 2.10, bf16/fp16)")
                continue
            try:
                tower = tower or _tower(stock, variant, args.device, args.quick)
                host_grid = grid if variant != "stock" else grid.to(args.device)  # stock needs it on the device

                def run(tower=tower, pixels=pixels, host_grid=host_grid):
                    with torch.no_grad():
                        tower(pixels, grid_thw=host_grid)

                times = _timed(run, args.device, args.repeats)
                cell = {"scenario": scenario, "variant": variant, "patches": int(pixels.shape[0]),
                        "latency_ms": statistics.median(times), "min_ms": min(times)}
                if args.device == "cuda":
                    cell["gpu"] = _kernels(run)
                result["cells"].append(cell)
                print(f"{scenario:14s} {variant:8s} {cell['latency_ms']:9.2f} ms", flush=True)
            except Exception as exc:  # recorded, and the run goes on
                result["errors"].append({"cell": f"{scenario}/{variant}", "error": f"{type(exc).__name__}: {exc}",
                                         "traceback": traceback.format_exc()[-3000:]})
                print(f"{scenario:14s} {variant:8s} FAILED {type(exc).__name__}: {exc}", flush=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
    return 1 if result["errors"] else 0


def _scaled(item, unit: int, scale: float, quick: bool):
    """``item`` with its sides scaled (rounded to the model's unit) and, in a rehearsal, at most 4 frames."""
    def px(side: int) -> int:
        return max(unit, round(side * scale / unit) * unit)

    if isinstance(item, Image):
        return Image(px(item.height), px(item.width))
    if isinstance(item, Video):
        return Video(min(item.frames, 4) if quick else item.frames, px(item.height), px(item.width), item.fps)
    return item


if __name__ == "__main__":
    raise SystemExit(main())
