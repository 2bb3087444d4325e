"""One audited forward of a Qwen-VL model: what ``syncfree audit`` and ``syncfree demo`` run.

Builds the model (preset or checkpoint) and processor-style inputs on the CPU,
puts both on the device as ``processor(...).to("cuda")`` would (a real GPU when
there is one, else the emulated one), and audits one forward of the chosen scope:

* ``vision``: the vision tower alone, for each modality present;
* ``rope``: the 3D (M-RoPE) position index alone;
* ``full``: the whole prefill forward (vision, feature merge, rope index, text model).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .audit import Report, audit, emulate_cuda
from .inputs import build_inputs, named_layout
from .presets import PRESETS, build_model, build_vision_model, load_config

__all__ = ["AuditSpec", "run_audit", "run_compare", "SCOPES", "VARIANTS"]

SCOPES = ("vision", "rope", "full")


@dataclass(frozen=True)
class AuditSpec:
    model: str = "qwen3-vl-tiny"
    inputs: str = "image"
    attn: str = "sdpa"
    scope: str = "full"
    text_layers: int | None = None
    dtype: torch.dtype = torch.float32
    image_side: int | None = None  # pixels; default 64 for the tiny preset, 448 otherwise
    seed: int = 0

    def side(self) -> int:
        if self.image_side is not None:
            return self.image_side
        return 64 if self.model.endswith("-tiny") else 448


# What the comparison runs: stock with inputs moved as `processor(...).to("cuda")` does, the patched
# model given the same inputs (it reads the control tensors once), and the patched model fed by prepare().
VARIANTS = ("stock", "patched", "patched+prepare")


def _forward(model, batch: dict, scope: str) -> None:
    plan = batch.get("syncfree_plan")
    if scope == "vision":
        for pixels, grid, kind in (("pixel_values", "image_grid_thw", "image"),
                                   ("pixel_values_videos", "video_grid_thw", "video")):
            if pixels in batch:
                extra = {"syncfree_vision_plan": getattr(plan, kind)} if plan is not None else {}
                model(batch[pixels].to(model.dtype), grid_thw=batch[grid], **extra)
    elif scope == "rope":
        model.model.get_rope_index(
            input_ids=batch["input_ids"],
            mm_token_type_ids=batch["mm_token_type_ids"],
            image_grid_thw=batch.get("image_grid_thw"),
            video_grid_thw=batch.get("video_grid_thw"),
            attention_mask=batch.get("attention_mask"),
            **({"syncfree_plan": plan} if plan is not None else {}),
        )
    else:
        model(**batch)


def run_audit(spec: AuditSpec, engine: str = "auto") -> tuple[Report, dict]:
    """Audit one stock forward; returns the report and a description of what ran."""
    reports, about = run_compare(spec, engine, variants=("stock",))
    return reports["stock"], about


def run_compare(spec: AuditSpec, engine: str = "auto", variants: tuple[str, ...] = VARIANTS) -> tuple[dict, dict]:
    """Audit one forward per variant (stock, patched, patched+prepare) of one model; returns reports by variant."""
    from .patching import patch, unpatch
    from .prepare import prepare

    if spec.scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {spec.scope!r}")
    config = load_config(spec.model, attn=spec.attn)
    pad = PRESETS[spec.model].pad_token_id if spec.model in PRESETS else None
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    batch = build_inputs(config, named_layout(spec.inputs, spec.side(), unit), seed=spec.seed, pad_token_id=pad)
    if spec.scope == "vision":
        model = build_vision_model(spec.model, attn=spec.attn, dtype=spec.dtype, seed=spec.seed)
    else:
        model = build_model(spec.model, attn=spec.attn, dtype=spec.dtype, text_layers=spec.text_layers,
                            seed=spec.seed)
    use_gpu = engine == "cuda" or (engine == "auto" and torch.cuda.is_available())
    context = contextlib.nullcontext() if use_gpu else emulate_cuda()
    reports = {}
    with context, torch.no_grad():
        model.to("cuda")
        for variant in variants:
            if variant == "stock":
                unpatch(model)
            else:
                patch(model)
            if variant == "patched+prepare":
                device_batch = prepare(batch, "cuda", config)
            else:
                device_batch = {k: v.to("cuda") for k, v in batch.items()}
            if use_gpu:
                _forward(model, device_batch, spec.scope)  # warm-up: first calls initialize kernels and caches
                torch.cuda.synchronize()
            with audit("cuda" if use_gpu else "emulated") as report:
                _forward(model, device_batch, spec.scope)
            reports[variant] = report
        unpatch(model)
    about = {
        "model": spec.model,
        "inputs": spec.inputs,
        "attn": spec.attn,
        "scope": spec.scope,
        "engine": report.engine,
        "variants": list(variants),
        "vision_depth": config.vision_config.depth,
        "text_layers": spec.text_layers or config.text_config.num_hidden_layers,
        "grids": {k: v.tolist() for k, v in batch.items() if k.endswith("grid_thw")},
        "sequence": list(batch["input_ids"].shape),
    }
    return reports, about
