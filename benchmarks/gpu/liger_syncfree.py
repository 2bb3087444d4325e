"""Liger-Kernel alone, then Liger-Kernel + syncfree, on one training step of a Qwen-VL: loss, syncs, step time.

Qwen3-VL-2B shapes (text shortened to 2 layers, random weights), bfloat16, one 448 px image and text, labels on
every token. Both variants get Liger's default kernels for the family (rotary, RMSNorm, fused linear cross entropy:
``apply_liger_kernel_to_qwen3_vl(model=...)``); the second also ``syncfree.patch`` and a prepared batch. Per variant:
the first step's loss (the two must be equal: same weights, same batch, same kernels), the syncs of one step by
phase (the real-CUDA auditor), and the step time (median of CUDA-event timings). The JSON is written after each
variant; a variant that fails is recorded under "errors".

    python benchmarks/gpu/liger_syncfree.py --out OUT/liger_syncfree.json            # on the GPU
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import sys
import time
import traceback

import torch

import syncfree
from syncfree.compare.train import labels_for
from syncfree.inputs import Image, Text, build_inputs
from syncfree.presets import PRESETS, build_model, load_config

APPLY = {"qwen3_vl": "apply_liger_kernel_to_qwen3_vl", "qwen2_5_vl": "apply_liger_kernel_to_qwen2_5_vl"}
FORWARDS = {"qwen3_vl": "liger_kernel.transformers.model.qwen3_vl",
            "qwen2_5_vl": "liger_kernel.transformers.model.qwen2_5_vl"}


def _liger(model_type: str):
    """Liger's apply function for the family, or the one-line reason it cannot be had here."""
    try:
        import liger_kernel.transformers as liger

        importlib.import_module(FORWARDS[model_type])  # (some Liger releases cannot import it on newer Transformers)
    except ImportError as e:
        return None, f"Liger-Kernel is not usable here for {model_type}: {e}"
    return getattr(liger, APPLY[model_type]), None


def _batch(preset: str) -> dict:
    config = load_config(preset)
    batch = build_inputs(config, [[Text(16), Image(448, 448), Text(16)]], pad_token_id=PRESETS[preset].pad_token_id)
    batch["labels"] = labels_for(batch)
    return batch


def _variant(preset: str, text_layers: int, with_syncfree: bool, apply, repeats: int) -> dict:
    from syncfree.bench.runner import time_calls

    model = build_model(preset, dtype=torch.bfloat16, text_layers=text_layers, seed=0, device="cuda").train()
    apply(model=model)
    if with_syncfree:
        syncfree.patch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = _batch(preset)

    def step(record: list | None = None):
        if with_syncfree:
            kwargs = syncfree.prepare(batch, "cuda", model)
        else:
            kwargs = {k: v.to("cuda") for k, v in batch.items()}
        loss = model(**kwargs).loss
        loss.backward()
        optimizer.zero_grad(set_to_none=True)  # (no update: every step sees the same weights)
        if record is not None:
            record.append(loss.detach())

    losses: list = []
    step(losses)  # warm-up (Triton compiles its kernels here), and the loss to compare
    with syncfree.audit() as report:
        step()
        torch.cuda.synchronize()
    times = time_calls(step, "cuda", repeats, budget_s=30)
    return {"loss": losses[0].float().item(), "loss_bits": losses[0].view(torch.int16).item(),
            "syncs": len(report.syncs), "syncs_by_phase": report.by_phase(),
            "sync_lines": sorted({e.line for e in report.syncs}),
            "step_ms": sorted(times)[len(times) // 2], "step_ms_all": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-vl-2b", choices=[p for p in PRESETS if p.startswith(("qwen3-vl",
                                                                                                        "qwen2.5-vl"))])
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="liger_syncfree.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("liger_syncfree.py: no CUDA device here; Liger-Kernel's Triton kernels need one (on the CPU, "
              "examples/liger_with_syncfree.py checks how the two compose)", file=sys.stderr)
        return 2
    result = {"model": args.model, "text_layers": args.text_layers, "torch": torch.__version__,
              "transformers": importlib.import_module("transformers").__version__, "variants": {}, "errors": {}}

    def write():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)

    apply, reason = _liger(load_config(args.model).model_type)
    if apply is None:
        result["errors"]["liger"] = reason
        write()
        print(reason)
        return 1
    result["liger_kernel"] = importlib.metadata.version("liger-kernel")
    for name, with_syncfree in (("liger", False), ("liger+syncfree", True)):
        start = time.perf_counter()
        try:
            result["variants"][name] = _variant(args.model, args.text_layers, with_syncfree, apply, args.repeats)
        except Exception:  # recorded; the other variant still runs
            result["errors"][name] = traceback.format_exc(limit=8)
        print(f"{name}: {result['variants'].get(name, 'failed')} ({time.perf_counter() - start:.0f} s)")
        write()
        torch.cuda.empty_cache()
    both = result["variants"]
    if len(both) == 2:
        a, b = both["liger"], both["liger+syncfree"]
        result["loss_equal"] = a["loss_bits"] == b["loss_bits"]
        result["speedup"] = a["step_ms"] / b["step_ms"]
        write()
        print(f"loss equal: {result['loss_equal']}  syncs {a['syncs']} -> {b['syncs']}  "
              f"step {a['step_ms']:.1f} -> {b['step_ms']:.1f} ms")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
