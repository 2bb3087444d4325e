"""Padded stock batches against packed syncfree batches: padding, tokens per second and training-step time, on the
CPU or a GPU.

Run: python benchmarks/packing.py [--steps 3] [--out benchmarks/results/packing.json]
On a GPU (benchmarks/gpu/run.sh): --device cuda --dtype bfloat16 --attn flash_attention_2 sdpa
Writes to the temp folder unless --out says otherwise.

Samples of varied length (text of 16-512 tokens, 0-4 images of a few sizes, seeded) are taken 4 at a time. Each group
runs as stock runs it, padded to its longest sample (4 rows, right padding, labels -100 on the padding), on the stock
model; and packed by ``syncfree.packing_collator`` (rows of at most --max-tokens), on the same model patched. Both get
the same samples, the same weights and the same token-weighted loss. Timed per group, after one warm-up group: the
forward (no grad) and a training step (forward, backward, SGD step), each the median of --repeats runs. Tokens per
second count the samples' own tokens. The model: Qwen3-VL-2B's shapes (random weights) with --text-layers text layers.

On a GPU each batch is on the device before its clock starts (the padded one moved as a loader moves it, the packed
one by ``syncfree.prepare``), and the clock stops after ``torch.cuda.synchronize()``: a step's time is all of its
host and device work. ``--attn`` lists attention implementations in order of preference: the first the model builds
with and runs its warm-up group on is measured (``flash_attention_2`` takes Transformers' flash-attn package or its
hub kernel, and the packed batch's boundaries as its variable-length arguments); those before it are recorded with
why they were passed over. ``--deadline`` starts no new group past that many seconds, and the JSON is rewritten after
every group, so a run cut short keeps what it measured; a failing group is recorded under "errors" and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback

import torch
import transformers

import syncfree
from syncfree.families import processor_batch
from syncfree.inputs import Image, Text
from syncfree.presets import build_model, load_config

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


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(model, batch: dict, train: bool, optimizer, device: str, repeats: int) -> float:
    """Seconds per call, the median of ``repeats``: a forward without grad, or a training step."""
    times = []
    for _ in range(repeats):
        _sync(device)
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
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _moved(batch: dict, device: str) -> dict:
    """A padded batch on ``device``, as a training loop's loader moves it."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _group(model, group: list[dict], args, optimizer) -> dict:
    """One group, padded on stock and packed on syncfree: its row of the results (raises where a variant fails)."""
    stock_batch = padded(group)
    syncfree.patch(model)
    try:
        packed = syncfree.packing_collator(model, max_tokens=args.max_tokens)(group)
        times = {}
        for variant in ("padded", "packed"):
            if variant == "padded":
                syncfree.unpatch(model)
                batch = _moved(stock_batch, args.device)
            else:
                syncfree.patch(model)
                batch = syncfree.prepare(packed, args.device, model)
            times[variant] = {"forward": _timed(model, batch, False, optimizer, args.device, args.repeats),
                              "train": _timed(model, batch, True, optimizer, args.device, args.repeats)}
    finally:
        syncfree.unpatch(model)
        optimizer.zero_grad(set_to_none=True)  # (a step that failed halfway leaves nothing for the next group)
        model.eval()
    return {"sample_tokens": [s["input_ids"].shape[1] for s in group],
            "images": [int(s["image_grid_thw"].shape[0]) if "image_grid_thw" in s else 0 for s in group],
            "padded_shape": list(stock_batch["input_ids"].shape), "packed_shape": list(packed["input_ids"].shape),
            "times_s": times}


def _summary(rows: list[dict]) -> dict:
    """Padding, tokens/s and step time over the timed groups (those after the warm-up that ran); empty if none."""
    timed = [r for r in rows if not r["warm_up"]]
    if not timed:
        return {}
    tokens = sum(sum(r["sample_tokens"]) for r in timed)
    positions = {"padded": sum(r["padded_shape"][0] * r["padded_shape"][1] for r in timed),
                 "packed": sum(r["packed_shape"][0] * r["packed_shape"][1] for r in timed)}
    totals = {v: {k: sum(r["times_s"][v][k] for r in timed) for k in ("forward", "train")} for v in positions}

    def per_second(variant: str, kind: str) -> float:
        return tokens / totals[variant][kind]

    return {
        "timed_groups": len(timed),
        "sample_tokens": tokens,
        "padding_fraction": {v: 1 - tokens / positions[v] for v in positions},
        "tokens_per_s": {v: {k: per_second(v, k) for k in ("forward", "train")} for v in totals},
        "step_s": {v: {k: totals[v][k] / len(timed) for k in ("forward", "train")} for v in totals},
        "ratio_packed_over_padded": {k: per_second("packed", k) / per_second("padded", k) for k in ("forward", "train")},
        "median_step_ratio": {k: statistics.median(r["times_s"]["padded"][k] / r["times_s"]["packed"][k]
                                                   for r in timed) for k in ("forward", "train")},
    }


def _write(result: dict, out: str) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-vl-2b")
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="samples per padded batch (and per packed batch)")
    parser.add_argument("--steps", type=int, default=3, help="timed groups, after one warm-up group")
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--attn", nargs="+", default=["sdpa"],
                        help="attention implementations in order of preference: the first that builds and runs the "
                             "warm-up group is measured (e.g. flash_attention_2 sdpa)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per group and variant (their median is kept)")
    parser.add_argument("--deadline", type=float, default=None, help="seconds: start no new group after this")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "syncfree-results", "packing.json"),
                        help="where to write (default: the temp folder; the recorded run: benchmarks/results/)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is false)")
    start = time.perf_counter()

    config = load_config(args.model, text_layers=args.text_layers)
    layouts = samples(config, args.group * (args.steps + 1), args.seed)
    per_sample = []
    for i, items in enumerate(layouts):
        s = processor_batch(config, [items], seed=args.seed + i)
        s["labels"] = s["input_ids"].clone()
        per_sample.append(s)
    groups = [per_sample[i:i + args.group] for i in range(0, len(per_sample), args.group)]

    result = {
        "benchmark": "packing",
        "model": args.model, "text_layers": args.text_layers, "group": args.group, "steps": args.steps,
        "max_tokens": args.max_tokens, "seed": args.seed, "image_sides": [list(s) for s in _SIDES],
        "device": args.device, "dtype": args.dtype, "repeats": args.repeats,
        "attn": None, "attn_passed_over": [], "rows": [], "errors": [], "not_run": [],
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }

    def late() -> bool:
        return args.deadline is not None and time.perf_counter() - start > args.deadline

    for attn in args.attn:
        if late():
            result["not_run"].append(f"attn {attn}")
            continue
        try:
            model = build_model(args.model, attn=attn, dtype=getattr(torch, args.dtype), text_layers=args.text_layers,
                                device=args.device)
        except Exception as exc:  # (flash attention where neither its package nor its hub kernel is here)
            result["attn_passed_over"].append({"attn": attn, "why": f"{type(exc).__name__}: {exc}"[:500]})
            print(f"attn {attn}: passed over ({type(exc).__name__}: {exc})", flush=True)
            continue
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
        implementation = model.config.text_config._attn_implementation
        rows, skipped = [], []
        for step, group in enumerate(groups):
            if late():
                skipped.append(f"group {step}")
                continue
            try:
                rows.append({"step": step, "warm_up": step == 0, **_group(model, group, args, optimizer)})
            except Exception as exc:  # recorded, and the run goes on
                result["errors"].append({"step": step, "attn": implementation, "error": f"{type(exc).__name__}: {exc}",
                                         "traceback": traceback.format_exc()[-3000:]})
                print(f"group {step} ({implementation}): FAILED {type(exc).__name__}: {exc}", flush=True)
                if step == 0:
                    break  # (its warm-up failed: the next implementation, if any)
                continue
            print(json.dumps(rows[-1]), flush=True)
            result.update(attn=implementation, rows=rows, timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          **_summary(rows))
            _write(result, args.out)
        if rows or skipped:
            result["not_run"] += skipped
            break
        result["attn_passed_over"].append({"attn": implementation, "why": "its warm-up group did not run"})
        del model, optimizer
        if args.device == "cuda":
            torch.cuda.empty_cache()
    result["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    _write(result, args.out)
    return 1 if result["errors"] or not result["rows"] else 0


if __name__ == "__main__":
    sys.exit(main())
