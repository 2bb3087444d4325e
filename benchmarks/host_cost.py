"""Host cost of syncfree's plan: what ``syncfree.prepare`` costs the host per layout, next to what it buys.

For each layout (one image up to a 32k-token batch and a 128-frame video), for Qwen3-VL and Qwen2.5-VL tiny
presets (the plan depends on the layout rules, not the model's width):

- ``prepare(batch, None, config)`` host time, minimum of ``--repeats`` runs, with 1 torch thread and with
  the default thread count (what a busy serving or training host pays; the forward thread waits this long);
- the bytes of the tensors the plan uploads with the batch (what ``prepare(batch, "cuda")`` copies beside it);
- with ``--syncs``, the syncs one forward makes stock and with the prepared plan (emulated device; small
  layouts only: the tiny model's forward over 100k patches takes minutes on a CPU).

With ``--families``, every fully supported family instead, each at its largest standard layout: 8 rows of 4 images
of 32 x 32 merged patches (about 32k tokens), with its tiny preset's layout rules and its own processor layout; time
(1 thread) and bytes uploaded per token.

Run: python benchmarks/host_cost.py [--repeats 5] [--syncs] [--families] [--out benchmarks/results/host_cost.json]
Writes to the temp folder unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import torch
import transformers

import syncfree
from syncfree.census.inputs import image_unit
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.plan.batch import PLAN_KEY
from syncfree.presets import load_config

MODELS = ("qwen3-vl-tiny", "qwen2.5-vl-tiny")


def layouts(unit: int) -> dict[str, list]:
    """Sides rounded to the family's patch x merge unit (448 for Qwen3-VL's 32, 448 for Qwen2.5-VL's 28)."""
    big, small = 448 // unit * unit, 224 // unit * unit
    row = [Text(16)] + [x for _ in range(4) for x in (Image(big, big), Text(8))] + [Video(32, big, big), Text(24)]
    return {
        "one 448x448 image": [[Text(12), Image(big, big), Text(20)]],
        "eight 224x224 images": [[Text(12)] + [x for _ in range(8) for x in (Image(small, small), Text(4))]],
        "one 32-frame 448x448 video": [[Text(12), Video(32, big, big), Text(20)]],
        "one 128-frame 448x448 video": [[Text(12), Video(128, big, big), Text(20)]],
        "8 rows x (4 images 448x448 + a 32-frame video)": [row for _ in range(8)],
    }


def _light_pixels(batch: dict) -> dict:
    """Pixel tensors of the right shape without the memory (prepare reads only their shape)."""
    for name in ("pixel_values", "pixel_values_videos"):
        if isinstance(batch.get(name), torch.Tensor):
            shape = batch[name].shape
            batch[name] = torch.zeros((1,) * len(shape)).expand(shape)
    return batch


def family_rows(repeats: int) -> list[dict]:
    """Every fully supported family's plan at its largest standard layout (``--families``)."""
    import importlib.util

    from syncfree.families import FAMILIES, processor_batch, tiny_preset

    rows = []
    for model_type, family in FAMILIES.items():
        if importlib.util.find_spec(family.modeling.rsplit(".", 1)[0]) is None:
            continue
        try:
            preset = tiny_preset(model_type)
        except ValueError:
            continue  # (a family this release registers no preset of)
        config = load_config(preset)
        if getattr(config, "vision_config", None) is None:
            continue  # (an audio-only family: no image layout)
        side = 32 * image_unit(config)
        row = [Text(16)] + [x for _ in range(4) for x in (Image(side, side), Text(8))]
        try:
            batch = _light_pixels(dict(processor_batch(config, [row] * 8)))
            plan = syncfree.prepare(batch, None, config)[PLAN_KEY]
        except Exception as err:  # noqa: BLE001 -- recorded: a family whose processor takes no such layout
            rows.append({"family": model_type, "error": f"{type(err).__name__}: {str(err)[:160]}"})
            print(f"{model_type:24} {rows[-1]['error']}", flush=True)
            continue
        tokens = int(batch["input_ids"].numel())
        found = {"family": model_type, "preset": preset, "tokens": tokens, "plan_bytes": plan.nbytes(),
                 "bytes_per_token": plan.nbytes() / tokens,
                 "ms_1_thread": 1e3 * time_prepare(batch, config, repeats, 1)}
        rows.append(found)
        print(f"{model_type:24} {tokens:>6} tokens  {found['ms_1_thread']:7.2f} ms  "
              f"{found['bytes_per_token']:6.1f} B/token", flush=True)
    return rows


def time_prepare(batch: dict, config, repeats: int, threads: int | None) -> float:
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        syncfree.prepare(batch, None, config)  # warm-up (imports, caches a first call fills)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            syncfree.prepare(batch, None, config)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(saved)
    return min(times)


def forward_syncs(model_name: str, batch: dict) -> dict:
    """Syncs of one forward on the emulated device: stock, and patched with the prepared batch."""
    from syncfree.audit import audit, emulate_cuda
    from syncfree.presets import build_model

    counts = {}
    for mode in ("stock", "prepared"):
        model = build_model(model_name).eval()
        with emulate_cuda(), torch.no_grad():
            model.to("cuda")
            if mode == "stock":
                kwargs = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            else:
                syncfree.patch(model)
                kwargs = syncfree.prepare(batch, "cuda", model)
            with audit() as report:
                model(**kwargs)
        counts[mode] = len(report.syncs)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--syncs", action="store_true", help="also count the syncs of one forward (small layouts)")
    parser.add_argument("--only", help="run only layouts whose name contains this")
    parser.add_argument("--families", action="store_true",
                        help="every fully supported family at its largest standard layout instead")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "syncfree-results", "host_cost.json"),
                        help="where to write (default: the temp folder; the recorded run: benchmarks/results/)")
    args = parser.parse_args()

    rows, syncs = [], []
    if args.families:
        result = {"torch": torch.__version__, "transformers": transformers.__version__, "machine": platform.machine(),
                  "cpus": os.cpu_count(), "repeats": args.repeats,
                  "method": f"minimum of {args.repeats} prepare() calls, with the code of this release",
                  "families": family_rows(args.repeats)}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
        return
    for model_name in MODELS:
        config = load_config(model_name)
        unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
        for name, samples in layouts(unit).items():
            if args.only and args.only not in name:
                continue
            batch = build_inputs(config, samples)
            light = _light_pixels(dict(batch))
            plan = syncfree.prepare(light, None, config)[PLAN_KEY]
            patches = sum(v.num_patches for v in (plan.image, plan.video) if v is not None)
            row = {"model": model_name, "layout": name, "tokens": int(batch["attention_mask"].sum()),
                   "patches": patches, "plan_bytes": plan.nbytes(),
                   "ms_1_thread": 1e3 * time_prepare(light, config, args.repeats, 1),
                   "ms_default_threads": 1e3 * time_prepare(light, config, args.repeats, None)}
            rows.append(row)
            print(f"{model_name:16} {name:48} {row['tokens']:>6} tokens {patches:>7} patches  "
                  f"{row['ms_1_thread']:8.2f} ms (1 thread) {row['ms_default_threads']:8.2f} ms (default)  "
                  f"plan {row['plan_bytes'] / 1e6:6.2f} MB", flush=True)
            if args.syncs and patches <= 4096:
                syncs.append((row, model_name, batch))
    for row, model_name, batch in syncs:  # after every timing: forwards disturb the allocator and caches
        row["syncs"] = forward_syncs(model_name, batch)
        print(f"{model_name:16} {row['layout']:48} syncs of one forward: {row['syncs']}", flush=True)
    result = {"torch": torch.__version__, "transformers": transformers.__version__, "machine": platform.machine(),
              "cpus": os.cpu_count(), "default_threads": torch.get_num_threads(), "repeats": args.repeats,
              "method": f"minimum of {args.repeats} prepare() calls, with the code of this release", "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
