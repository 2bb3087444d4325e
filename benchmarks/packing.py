"""Padded stock batches against packed syncfree batches: padding, tokens per second and training-step time, on the CPU.

Run: python benchmarks/packing.py [--steps 3] [--out benchmarks/results/packing.json]
Writes to the temp folder unless --out says otherwise.

Samples of varied length (text of 16-512 tokens, 0-4 images of a few sizes, seeded) are taken 4 at a time. Each group
runs as stock runs it, padded to its longest sample (4 rows, right padding, labels -100 on the padding), on the stock
model; and packed by ``syncfree.packing_collator`` (rows of at most --max-tokens), on the same model patched. Both get
the same samples, the same weights and the same token-weighted loss. Timed per group, after one warm-up group: the
forward (no grad) and a training step (forward, backward, SGD step). Tokens per second count the samples' own tokens.
The model: Qwen3-VL-2B's shapes (random weights) with --text-layers text layers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time

import torch
import transformers

import syncfree
from syncfree.families import processor_batch
from syncfree.inputs import Image, Text
from syncfree.presets import build_model

_SIDES = ((128, 128), (256, 192), (320, 320))  # (height, width) in pixels: 16, 48 and 100 tokens at patch 16, merge 2


def samples(config, n: int, seed: int) -> list[list]:
    """``n`` samples: text of 16-512 tokens cut around 0-4 images of the sizes above, seeded."""
    rng = random.Random(seed)
    found = []
    for _ in range(n):
        text, images = rng.randint(16, 512), rng.randint(0, 4)
        cuts = sorted(rng.sample(range(1, text), images)) if images else []
        parts = [b - a for a, b in zip([0, *cuts], [*cuts, text])]
        items: list = [Text(parts[0])]
        for part in parts[1:]:
            items += [Image(*rng.choice(_SIDES)), Text(part)]
        found.append(items)
    return found


def padded(batch: list[dict]) -> dict:
    """The samples as one right-padded batch, as a padding collator makes it (labels -100 on the padding)."""
    width = max(s["input_ids"].shape[1] for s in batch)
    out = {}
    for name, fill in (("input_ids", 0), ("attention_mask", 0), ("mm_token_type_ids", 0), ("labels", -100)):
        out[name] = torch.cat([torch.nn.functional.pad(s[name], (0, width - s[name].shape[1]), value=fill)
                               for s in batch])
    for name in ("pixel_values", "image_grid_thw"):
        parts = [s[name] for s in batch if name in s]
        if parts:
            out[name] = torch.cat(parts)
    return out


def _timed(model, batch: dict, train: bool, optimizer) -> float:
    start = time.perf_counter()
    if train:
        model.train()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.eval()
    else:
        with torch.no_grad():
            model(**batch)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen3-vl-2b")
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="samples per padded batch (and per packed batch)")
    parser.add_argument("--steps", type=int, default=3, help="timed groups, after one warm-up group")
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "syncfree-results", "packing.json"),
                        help="where to write (default: the temp folder; the recorded run: benchmarks/results/)")
    args = parser.parse_args()

    model = build_model(args.model, text_layers=args.text_layers)
    layouts = samples(model.config, args.group * (args.steps + 1), args.seed)
    per_sample = []
    for i, items in enumerate(layouts):
        s = processor_batch(model.config, [items], seed=args.seed + i)
        s["labels"] = s["input_ids"].clone()
        per_sample.append(s)
    groups = [per_sample[i:i + args.group] for i in range(0, len(per_sample), args.group)]
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)

    rows, totals = [], {"padded": {"forward": 0.0, "train": 0.0}, "packed": {"forward": 0.0, "train": 0.0}}
    positions = {"padded": 0, "packed": 0}
    tokens = 0
    for step, group in enumerate(groups):
        stock_batch = padded(group)
        syncfree.patch(model)
        packed = syncfree.packing_collator(model, max_tokens=args.max_tokens)(group)
        times = {}
        for variant, batch in (("padded", stock_batch), ("packed", packed)):
            if variant == "padded":
                syncfree.unpatch(model)
            else:
                syncfree.patch(model)
            times[variant] = {"forward": _timed(model, batch, False, optimizer),
                              "train": _timed(model, batch, True, optimizer)}
        syncfree.unpatch(model)
        own = sum(s["input_ids"].shape[1] for s in group)
        row = {"step": step, "warm_up": step == 0, "sample_tokens": [s["input_ids"].shape[1] for s in group],
               "images": [int(s["image_grid_thw"].shape[0]) if "image_grid_thw" in s else 0 for s in group],
               "padded_shape": list(stock_batch["input_ids"].shape), "packed_shape": list(packed["input_ids"].shape),
               "times_s": times}
        rows.append(row)
        print(json.dumps(row))
        if step == 0:
            continue
        tokens += own
        positions["padded"] += stock_batch["input_ids"].numel()
        positions["packed"] += packed["input_ids"].numel()
        for variant in times:
            for kind in times[variant]:
                totals[variant][kind] += times[variant][kind]

    def per_second(variant: str, kind: str) -> float:
        return tokens / totals[variant][kind]

    result = {
        "benchmark": "packing",
        "model": args.model, "text_layers": args.text_layers, "group": args.group, "steps": args.steps,
        "max_tokens": args.max_tokens, "seed": args.seed, "image_sides": [list(s) for s in _SIDES],
        "sample_tokens": tokens,
        "padding_fraction": {v: 1 - tokens / positions[v] for v in positions},
        "tokens_per_s": {v: {k: per_second(v, k) for k in ("forward", "train")} for v in totals},
        "step_s": {v: {k: totals[v][k] / args.steps for k in ("forward", "train")} for v in totals},
        "ratio_packed_over_padded": {k: per_second("packed", k) / per_second("padded", k) for k in ("forward", "train")},
        "median_step_ratio": {k: statistics.median(r["times_s"]["padded"][k] / r["times_s"]["packed"][k]
                                                   for r in rows[1:]) for k in ("forward", "train")},
        "rows": rows,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
