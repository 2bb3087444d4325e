"""``syncfree patch --report``: what ``syncfree.patch`` does to one model and what it leaves, for any model type with
the packed vision split, fully supported or not.

The model is a preset or a checkpoint folder (a fully supported family), or a model type of the installed
Transformers (the census's tiny model of it, fully supported or given the generic fix). What was rewritten is read
back from the patched model (``patch_report.describe_patch``); what is left comes from one forward on the emulated
device, stock then patched (then patched with ``prepare()``, where the family is fully supported), every sync by
source line.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

__all__ = ["PatchRun", "run_patch_report", "run_patch_command"]


@dataclass
class PatchRun:
    description: object  # patch_report.PatchDescription
    reports: dict  # variant -> audit Report ("stock", "patched", "patched+prepare")
    same_outputs: bool
    model: str  # what was built, in words
    refused: str = ""  # why syncfree leaves it stock on this release (a family whose code changed), if it does


def _build(model: str, inputs: str, dtype: torch.dtype, text_layers: int | None) -> tuple[torch.nn.Module, dict, str]:
    from ..compare.forward import AuditSpec, spec_batch
    from ..presets import PRESETS, build_model, load_config
    from .run import discover, tiny_model_and_batch

    if model in PRESETS or os.path.isdir(model):
        spec = AuditSpec(model=model, inputs=inputs, text_layers=text_layers, dtype=dtype)
        batch = spec_batch(spec, load_config(model))
        built = build_model(model, dtype=dtype, text_layers=text_layers)
        return built, batch, f"{model} ({'random weights' if model in PRESETS else 'checkpoint'}), {inputs} inputs"
    if model in discover():
        built, batch = tiny_model_and_batch(model)
        built = built.to(dtype)
        batch = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in batch.items()}
        inputs = "two images" if "pixel_values" in batch else "its processor's clips"  # (Qwen3-ASR: audio only)
        return built, batch, f"a tiny {model} from its config (the census's), {inputs}"
    raise ValueError(f"--model {model}: not a preset, a checkpoint folder, or a model type with the packed vision "
                     "split in the installed Transformers (`syncfree census` lists those)")


def run_patch_report(model: str, *, inputs: str = "images", dtype: torch.dtype = torch.float32,
                     text_layers: int | None = None) -> PatchRun:
    from ..audit import audit, emulate_cuda
    from ..inputs import batch_to
    from ..patch_report import describe_patch
    from ..patching import patch, refusal_for
    from ..prepare import prepare
    from .run import output_of

    built, batch, what = _build(model, inputs, dtype, text_layers)
    refused = refusal_for(built)
    if refused is not None:  # (data, not an error: the stock audit stands, and the run says why there is no other)
        with emulate_cuda(), torch.no_grad():
            built.to("cuda")
            kwargs = batch_to(batch, "cuda")
            with audit() as report:
                built(**kwargs)
        return PatchRun(None, {"stock": report}, True, what, refused=str(refused))
    reports, outputs = {}, {}
    with emulate_cuda(), torch.no_grad():
        built.to("cuda")
        for variant in ("stock", "patched", "patched+prepare"):
            if variant == "patched":
                patch(built)
                description = describe_patch(built)
            if variant == "patched+prepare" and description.support != "full":
                break
            kwargs = prepare(batch, "cuda", built) if variant == "patched+prepare" else batch_to(batch, "cuda")
            with audit() as report:
                out = output_of(built(**kwargs))
            outputs[variant], reports[variant] = out.cpu(), report
            if hasattr(getattr(built, "model", None), "rope_deltas"):
                built.model.rope_deltas = None  # (cached by the forward: an emulated tensor otherwise)
    same = all(o.shape == outputs["stock"].shape and torch.equal(o, outputs["stock"]) for o in outputs.values())
    return PatchRun(description, reports, same, what)


def run_patch_command(args: argparse.Namespace, dtypes: dict) -> int:
    if not args.report:
        raise ValueError("syncfree patch patches models in Python (syncfree.patch(model)); from the command line it "
                         "reports what it would do to one: add --report")
    run = run_patch_report(args.model, inputs=args.inputs, dtype=getattr(torch, dtypes[args.dtype]),
                           text_layers=args.text_layers)
    print(f"syncfree patch --report: {run.model}")
    if run.refused:
        print(f"not patched: {run.refused}")
        print(f"\nsyncs in one stock forward on the emulated device: {len(run.reports['stock'].syncs)}")
        return 0
    print("\n".join(run.description.lines(audit_hint=False)))  # (this is that command: the syncs left come next)
    counts = " -> ".join(f"{variant} {len(r.syncs)} ({len(r.blocking_copies)} blocking copies)"
                         for variant, r in run.reports.items())
    print(f"\nsyncs in one forward on the emulated device: {counts}; outputs "
          f"{'equal to stock' if run.same_outputs else 'DIFFER from stock'}")
    last, report = list(run.reports.items())[-1]
    print(f"\nleft ({last}):\n" + (report.table() if report.syncs or report.blocking_copies else "(nothing)"))
    return 0 if run.same_outputs else 1
