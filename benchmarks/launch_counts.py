"""Kernel launches of one vision-tower forward, stock vs each patched attention backend (emulated device).

    python benchmarks/launch_counts.py [--model qwen3-vl-8b]

The count is every aten op the forward runs on device data that launches a kernel on CUDA (see
``syncfree/audit/launches.py``), and of those the attention calls. Launches depend on the layout (how
many images and frames, of which sizes relative to each other), not on the pixel count, so each
scenario runs at the smallest size with its layout (32 px sides), which keeps the 32-frame video cheap
on a CPU; the segment structure is that of the real inputs. Writes launch_counts.json to $TMPDIR/syncfree-results
(``--out benchmarks/results/launch_counts.json`` records it).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile

import torch

import syncfree
from syncfree.audit import audit, emulate_cuda
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.presets import build_vision_model, load_config

# Real layouts: one image, 8 same-size images, a 32-frame video (16 segments at temporal patch 2).
SCENARIOS = {"1 image": [Text(4), Image(32, 32), Text(4)],
             "8 images": [Text(2)] + [x for _ in range(8) for x in (Image(32, 32), Text(1))],
             "32-frame video": [Text(4), Video(32, 32, 32), Text(4)]}
VARIANTS = ("stock", "split", "grouped", "block_diagonal")


def _count(tower, pixels, grid) -> tuple[int, int, int]:
    with emulate_cuda(), torch.no_grad():
        tower.to("cuda")
        try:
            with audit() as report:
                tower(pixels.to("cuda"), grid_thw=grid.to("cuda"))
        finally:
            tower.to("cpu")
    return report.launches, report.launch_ops.get("aten::scaled_dot_product_attention", 0), len(report.syncs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-vl-8b")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "syncfree-results", "launch_counts.json"),
                        help="where to write (default: the temp folder; the recorded run: benchmarks/results/)")
    args = parser.parse_args()
    config = load_config(args.model)
    stock = build_vision_model(args.model)
    towers = {v: stock if v == "stock" else syncfree.patch(copy.deepcopy(stock), vision_attention=v) for v in VARIANTS}
    rows = []
    for scenario, items in SCENARIOS.items():
        batch = build_inputs(config, [items])
        kind = "pixel_values" if "pixel_values" in batch else "pixel_values_videos"
        grid = batch["image_grid_thw" if kind == "pixel_values" else "video_grid_thw"]
        for variant, tower in towers.items():
            launches, attention, syncs = _count(tower, batch[kind], grid)
            rows.append({"scenario": scenario, "variant": variant, "launches": launches, "attention_calls": attention,
                         "syncs": syncs, "segments": int(grid[:, 0].sum())})
            print(f"{scenario:15s} {variant:15s} launches {launches:5d}  attention calls {attention:4d}  "
                  f"syncs {syncs:3d}", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "vision_depth": config.vision_config.depth, "torch": torch.__version__,
                   "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
