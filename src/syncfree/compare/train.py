"""One audited training step of a Qwen-VL model: what ``syncfree audit --train`` runs.

A step as Hugging Face ``Trainer`` and most training loops run it: forward with ``labels``
(Transformers computes the causal-LM loss), ``loss.backward()``, ``optimizer.step()``,
``optimizer.zero_grad()``. Each variant (stock, patched, patched + ``prepare``) starts from the same
weights and optimizer state, so the three steps compute the same thing. Events are labelled by phase:
forward, recompute (gradient checkpointing), backward, optimizer (see ``audit/phases.py``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from ..audit import Report, audit, emulate_cuda
from ..inputs import batch_to
from ..presets import PRESETS, build_model, load_config
from .forward import VARIANTS, AuditSpec, resolve_engine, spec_batch, vision_depth
from .progress import layer_progress

__all__ = ["GRAD_CKPT", "OPTIMIZERS", "labels_for", "train_step", "run_train_compare"]

GRAD_CKPT = ("reentrant", "non-reentrant")
# AdamW (PyTorch's default implementation for the device: foreach on CUDA) as most training runs use it;
# SGD keeps no state, for shapes whose AdamW state does not fit beside the weights and gradients.
OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
IGNORE_INDEX = -100  # what Transformers' loss skips


def labels_for(batch: dict) -> torch.Tensor:
    """Causal-LM labels as a collator makes them: the input ids, with padding and vision placeholders
    set to -100 (Transformers shifts them inside the loss)."""
    labels = batch["input_ids"].clone()
    if "attention_mask" in batch:
        labels[batch["attention_mask"] == 0] = IGNORE_INDEX
    if "mm_token_type_ids" in batch:
        labels[batch["mm_token_type_ids"] != 0] = IGNORE_INDEX
    return labels


def train_step(model, batch: dict, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """Forward with labels, backward, optimizer step, zero_grad; returns the (detached) loss."""
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def _enable_checkpointing(model, grad_ckpt: str | None) -> None:
    if grad_ckpt is None:
        return
    if grad_ckpt not in GRAD_CKPT:
        raise ValueError(f"grad_ckpt must be one of {', '.join(GRAD_CKPT)} or None, got {grad_ckpt!r}")
    kwargs = {"use_reentrant": grad_ckpt == "reentrant"}
    if hasattr(model, "activation_checkpointing_enable"):  # Transformers >= 5.2x; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def run_train_compare(spec: AuditSpec, grad_ckpt: str | None = None, engine: str = "auto",
                      variants: tuple[str, ...] = VARIANTS, lr: float = 1e-4, optimizer: str = "adamw",
                      progress: Callable[[str], None] | None = None) -> tuple[dict[str, Report], dict]:
    """Audit one training step per variant of one model; returns reports by variant and what ran.

    ``spec.scope`` must be ``full`` (a training step runs the whole model). ``optimizer``: ``"adamw"``
    (PyTorch's default implementation for the device: foreach on CUDA and on the emulated device) or
    ``"sgd"`` (no state: for shapes whose AdamW state does not fit).
    """
    from ..patching import patch, refusal_for, unpatch
    from ..prepare import prepare

    def say(text: str) -> None:
        if progress is not None:
            progress(text)

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    make_optimizer = OPTIMIZERS[optimizer]
    if spec.scope != "full":
        raise ValueError(f"a training step runs the whole model: scope must be 'full', got {spec.scope!r}")
    use_gpu = resolve_engine(engine)
    config = load_config(spec.model, attn=spec.attn)
    batch = spec_batch(spec, config)
    labels = labels_for(batch)
    started = time.perf_counter()
    say(f"building {spec.model}" + (" (random weights)" if spec.model in PRESETS else ""))
    model = build_model(spec.model, attn=spec.attn, dtype=spec.dtype, text_layers=spec.text_layers, seed=spec.seed)
    model.train()
    _enable_checkpointing(model, grad_ckpt)
    refused = refusal_for(model)  # (a family this release changed: stock only, and the run says why)
    if refused is not None:
        variants = tuple(v for v in variants if v == "stock")
    reports, losses = {}, {}
    timing = {"build_s": 0.0, "steps_s": 0.0}
    context = contextlib.nullcontext() if use_gpu else emulate_cuda()
    with context:
        say("moving the model to the " + ("GPU" if use_gpu else "emulated device"))
        model.to("cuda")
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        timing["build_s"] = time.perf_counter() - started
        started = time.perf_counter()
        for i, variant in enumerate(variants, 1):
            label = f"[{i}/{len(variants)} {variant}]"
            unpatch(model) if variant == "stock" else patch(model, vision_attention=spec.vision_attention)
            model.load_state_dict(initial)  # every variant steps from the same weights
            step_optimizer = make_optimizer(model.parameters(), lr=lr)
            if variant == "patched+prepare":
                device_batch = prepare(batch, "cuda", config)
                device_batch["labels"] = labels.to("cuda", non_blocking=True)
            else:
                device_batch = batch_to({**batch, "labels": labels}, "cuda")
            if use_gpu:  # warm-up: first calls initialize kernels and caches
                with layer_progress(model, f"{label} warm-up", progress):
                    train_step(model, device_batch, step_optimizer)
                model.load_state_dict(initial)
                step_optimizer = make_optimizer(model.parameters(), lr=lr)
                torch.cuda.synchronize()
            with layer_progress(model, label, progress), audit("cuda" if use_gpu else "emulated") as report:
                loss = train_step(model, device_batch, step_optimizer)
            reports[variant], losses[variant] = report, loss.to("cpu")
        unpatch(model)
        timing["steps_s"] = time.perf_counter() - started
    about = {
        "model": spec.model, "inputs": spec.inputs, "attn": spec.attn, "scope": "train",
        "grad_ckpt": grad_ckpt, "optimizer": optimizer, "engine": report.engine, "variants": list(variants),
        "vision_depth": vision_depth(config),
        "text_layers": spec.text_layers or config.text_config.num_hidden_layers,
        "grids": {k: v.tolist() for k, v in batch.items() if k.endswith("grid_thw")},
        "sequence": list(batch["input_ids"].shape),
        "losses": {v: float(x) for v, x in losses.items()},
        **timing,
    }
    if refused is not None:
        about["refused"] = str(refused)
    return reports, about
