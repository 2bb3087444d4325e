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
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..audit import Report, audit, emulate_cuda, real_cuda_available
from ..inputs import asr_layout, batch_to, is_audio_only, is_omni, named_layout, omni_layout, processor_batch
from ..prepare import plan_of
from ..presets import PRESETS, build_model, build_vision_model, load_config
from .checks import check_image_side, image_unit
from .progress import layer_progress
from .towers import tower_call

__all__ = ["AuditSpec", "run_audit", "run_compare", "spec_batch", "check_input_kind", "SCOPES", "VARIANTS",
           "resolve_engine"]

SCOPES = ("vision", "rope", "full")


@dataclass(frozen=True)
class AuditSpec:
    model: str = "qwen3-vl-tiny"
    inputs: str = "image"
    attn: str = "sdpa"
    scope: str = "full"
    text_layers: int | None = None
    dtype: torch.dtype = torch.float32
    image_side: int | None = None  # pixels, a multiple of the unit; default two units for a tiny preset, else 448
    seed: int = 0
    vision_attention: str = "split"  # the patched variants' vision attention backend (rewrite/attention.py)

    def side(self, unit: int = 32) -> int:
        """The image side in pixels; ``unit`` is patch size x merge size (32 for Qwen3-VL, 28 for Qwen2/2.5-VL)."""
        if self.image_side is not None:
            return self.image_side
        return 2 * unit if self.model.endswith("-tiny") else 448  # 448 = 14 x 32 = 16 x 28


# What the comparison runs: stock with inputs moved as `processor(...).to("cuda")` does, the patched
# model given the same inputs (it reads the control tensors once), and the patched model fed by prepare().
VARIANTS = ("stock", "patched", "patched+prepare")



def vision_depth(config) -> int:
    """The vision tower's block count (``depth`` in Qwen-style configs, ``num_hidden_layers`` in SigLIP-style ones); an
    audio-only model's (Qwen3-ASR's) encoder's."""
    vc = config.vision_config if hasattr(config, "vision_config") else config.audio_config
    return getattr(vc, "depth", None) or vc.num_hidden_layers

def _forward(model, batch: dict, scope: str) -> None:
    plan = plan_of(batch)  # the plan prepare() keeps beside the tensors it returned (None for stock)
    if scope == "vision":
        for pixels, grid, kind in (("pixel_values", "image_grid_thw", "image"),
                                   ("pixel_values_videos", "video_grid_thw", "video")):
            if pixels in batch:  # (as the model's get_*_features hands them: PaddleOCR-VL's 5D pixels, GLM's frames)
                pixels, grid, extra = tower_call(model, kind, batch[pixels], batch[grid], plan,
                                                 images_per_sample=batch.get("images_per_sample"))
                model(pixels, grid_thw=grid, **extra)
    elif scope == "rope" and "images_per_sample" in batch:  # GLM-Image's index (its grids split per sample)
        model.model.get_rope_index(input_ids=batch["input_ids"], image_grid_thw=batch["image_grid_thw"],
                                   images_per_sample=batch["images_per_sample"],
                                   attention_mask=batch.get("attention_mask"))
    elif scope == "rope" and "mm_token_type_ids" not in batch:  # an Omni thinker's index (audio lengths too)
        inner = model.model if hasattr(model.model, "audio_tower") else model
        mask = batch.get("feature_attention_mask")
        lengths = mask.sum(1) if mask is not None else None
        if plan is not None and plan.audio is not None:
            lengths = plan.audio.feature_lens  # what a prepared caller has on the host already
        inner.get_rope_index(batch["input_ids"], batch.get("image_grid_thw"), batch.get("video_grid_thw"),
                             batch.get("attention_mask"), batch.get("use_audio_in_video", False), lengths,
                             batch.get("video_second_per_grid"))
    elif scope == "rope":
        model.model.get_rope_index(
            input_ids=batch["input_ids"],
            mm_token_type_ids=batch["mm_token_type_ids"],
            image_grid_thw=batch.get("image_grid_thw"),
            video_grid_thw=batch.get("video_grid_thw"),
            attention_mask=batch.get("attention_mask"),
        )
    else:
        model(**batch)


def check_input_kind(spec: AuditSpec, config) -> None:
    """Refuse an input kind the model cannot take (audio for a model without an audio encoder), before any work."""
    if not is_audio_only(config) and not is_omni(config) and spec.inputs in ("audio", "audio-in-video"):
        raise ValueError(f"--inputs {spec.inputs} needs an Omni thinker (e.g. --model qwen3-omni-tiny); "
                         f"{spec.model} takes no audio")


def spec_batch(spec: AuditSpec, config) -> dict:
    """The processor-style CPU batch a spec describes (its input kind at its image side), checked first."""
    pad = PRESETS[spec.model].pad_token_id if spec.model in PRESETS else None
    if is_audio_only(config):  # Qwen3-ASR: clips only, no image side
        return processor_batch(config, asr_layout(spec.inputs), seed=spec.seed, pad_token_id=pad)
    check_image_side(spec.image_side, config)
    check_input_kind(spec, config)
    unit = image_unit(config)
    if is_omni(config):  # an Omni thinker: audio too
        samples = omni_layout(spec.inputs, spec.side(unit), unit)
    else:
        samples = named_layout(spec.inputs, spec.side(unit), unit)
    batch = processor_batch(config, samples, seed=spec.seed, pad_token_id=pad)
    if spec.dtype == torch.float32:
        return batch
    # As processor(...).to(dtype): a tower that does not cast its pixels (Kimi-K2.5's Conv2d) needs them in the model's
    # dtype; the others cast them first thing.
    return {k: v.to(spec.dtype) if k.startswith("pixel_values") and v.is_floating_point() else v
            for k, v in batch.items()}


def run_audit(spec: AuditSpec, engine: str = "auto") -> tuple[Report, dict]:
    """Audit one stock forward; returns the report and a description of what ran."""
    reports, about = run_compare(spec, engine, variants=("stock",))
    return reports["stock"], about


def resolve_engine(engine: str) -> bool:
    """True for the real GPU. Asked inside emulate_cuda(), torch.cuda.is_available() answers for the emulated one."""
    if engine not in ("auto", "emulated", "cuda"):
        raise ValueError(f"engine must be auto, emulated or cuda, got {engine!r}")
    return engine == "cuda" or (engine == "auto" and real_cuda_available())


def run_compare(spec: AuditSpec, engine: str = "auto", variants: tuple[str, ...] = VARIANTS,
                progress: Callable[[str], None] | None = None) -> tuple[dict, dict]:
    """Audit one forward per variant (stock, patched, patched+prepare) of one model; returns reports by variant.

    ``progress(text)``, if given, hears what is running: the build, then each variant's vision
    blocks and text layers as they start (e.g. ``"[2/3 patched] vision block 12/24"``).
    """
    from ..patching import patch, refusal_for, unpatch
    from ..prepare import prepare
    from .varlen import VARLEN, use_torch_varlen, varlen_problem

    def say(text: str) -> None:
        if progress is not None:
            progress(text)

    if spec.scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {spec.scope!r}")
    use_gpu = resolve_engine(engine)
    varlen = spec.attn == VARLEN
    if varlen:  # PyTorch's flash kernel: a real GPU, PyTorch >= 2.10, half precision
        if not use_gpu:
            raise ValueError(f"attn {VARLEN!r} runs PyTorch's flash kernel, which needs a real CUDA GPU; the emulated "
                             "device cannot run it")
        problem = varlen_problem("cuda", str(spec.dtype).replace("torch.", ""))
        if problem:
            raise ValueError(problem)
    attn = "sdpa" if varlen else spec.attn  # varlen is switched on after the build (see use_torch_varlen)
    config = load_config(spec.model, attn=attn)
    batch = spec_batch(spec, config)
    started = time.perf_counter()
    say(f"building {spec.model}" + (" (random weights)" if spec.model in PRESETS else ""))
    if spec.scope == "vision":
        model = build_vision_model(spec.model, attn=attn, dtype=spec.dtype, seed=spec.seed)
    else:
        model = build_model(spec.model, attn=attn, dtype=spec.dtype, text_layers=spec.text_layers,
                            seed=spec.seed)
    if varlen:
        use_torch_varlen(model)
    refused = refusal_for(model)  # (a family this release changed: stock only, and the run says why)
    if refused is not None:
        variants = tuple(v for v in variants if v == "stock")
    context = contextlib.nullcontext() if use_gpu else emulate_cuda()
    reports = {}
    timing = {"build_s": 0.0, "forwards_s": 0.0}
    with context, torch.no_grad():
        say("moving the model to the " + ("GPU" if use_gpu else "emulated device"))
        model.to("cuda")
        timing["build_s"] = time.perf_counter() - started
        started = time.perf_counter()
        for i, variant in enumerate(variants, 1):
            label = f"[{i}/{len(variants)} {variant}]"
            if variant == "stock":
                unpatch(model)
            else:
                patch(model, vision_attention=spec.vision_attention)
            if variant == "patched+prepare":
                device_batch = prepare(batch, "cuda", config)
            else:
                device_batch = batch_to(batch, "cuda")
            if use_gpu:
                with layer_progress(model, f"{label} warm-up", progress):
                    _forward(model, device_batch, spec.scope)  # warm-up: first calls initialize kernels and caches
                torch.cuda.synchronize()
            with layer_progress(model, label, progress), audit("cuda" if use_gpu else "emulated") as report:
                _forward(model, device_batch, spec.scope)
            reports[variant] = report
        unpatch(model)
        timing["forwards_s"] = time.perf_counter() - started
    about = {
        "model": spec.model,
        "inputs": spec.inputs,
        "attn": spec.attn,
        "scope": spec.scope,
        "engine": report.engine,
        "variants": list(variants),
        "vision_depth": vision_depth(config),
        "text_layers": spec.text_layers or config.text_config.num_hidden_layers,
        "grids": {k: v.tolist() for k, v in batch.items() if k.endswith("grid_thw")},
        "sequence": list(batch["input_ids"].shape),
        **timing,
    }
    if refused is not None:
        about["refused"] = str(refused)
    return reports, about
