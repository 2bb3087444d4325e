"""Emulation overhead: the Qwen3-VL-8B vision tower on one 448x448 image, plain CPU vs emulated CUDA.

Run: python benchmarks/emulation_overhead.py [--repeats N] [--out benchmarks/results/emulation_overhead.json]
Writes to the temp folder unless --out says otherwise. Both runs are in one process, interleaved, after one
warm-up each; the ratio is of medians.
The emulated output is checked to be bit-identical to the plain one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch
import transformers

from syncfree.audit import audit, emulate_cuda
from syncfree.inputs import Image, Text, build_inputs
from syncfree.presets import build_vision_model, load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen3-vl-8b")
    parser.add_argument("--side", type=int, default=448)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "syncfree-results", "emulation_overhead.json"),
                        help="where to write (default: the temp folder; the recorded run: benchmarks/results/)")
    args = parser.parse_args()

    config = load_config(args.model)
    batch = build_inputs(config, [[Text(4), Image(args.side, args.side), Text(4)]])
    pixels, grid = batch["pixel_values"], batch["image_grid_thw"]
    # Two identical models (same seed): .to("cuda") moves a module in place.
    plain_model = build_vision_model(args.model)
    emulated_model = build_vision_model(args.model)

    plain_times, emulated_times = [], []
    with torch.no_grad():
        reference = plain_model(pixels, grid_thw=grid).pooler_output  # warm-up
        with emulate_cuda():
            emulated_model.to("cuda")
            dev_pixels, dev_grid = pixels.to("cuda"), grid.to("cuda")
            with audit() as report:  # warm-up, and the sync count
                out = emulated_model(dev_pixels, grid_thw=dev_grid).pooler_output
            identical = torch.equal(out.elem, reference)
        for _ in range(args.repeats):
            start = time.perf_counter()
            plain_model(pixels, grid_thw=grid)
            plain_times.append(time.perf_counter() - start)
            with emulate_cuda():
                start = time.perf_counter()
                with audit():
                    emulated_model(dev_pixels, grid_thw=dev_grid)
                emulated_times.append(time.perf_counter() - start)

    result = {
        "benchmark": "emulation_overhead",
        "model": args.model,
        "image": [args.side, args.side],
        "grid_thw": grid.tolist(),
        "repeats": args.repeats,
        "plain_cpu_s": plain_times,
        "emulated_s": emulated_times,
        "plain_median_s": statistics.median(plain_times),
        "emulated_median_s": statistics.median(emulated_times),
        "ratio": statistics.median(emulated_times) / statistics.median(plain_times),
        "bit_identical": identical,
        "syncs_recorded": len(report.syncs),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_s")}, indent=2))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
