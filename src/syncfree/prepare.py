"""``prepare``: processor output on the host -> validated plan -> model kwargs on the device, without a sync."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .plan import ModelSpec, Plan, build_plan

__all__ = ["prepare"]

# Published Qwen3-VL checkpoints all use these; prepare() checks them against the model at forward time.
_QWEN3_VL_DEFAULT = ModelSpec("qwen3_vl", 2, 48, 151655, 151656, "transformers.models.qwen3_vl.modeling_qwen3_vl")

_PLAN_INPUTS = ("input_ids", "mm_token_type_ids", "attention_mask", "image_grid_thw", "video_grid_thw",
                "second_per_grid_ts", "pixel_values", "pixel_values_videos")
# Grids stay on the host: the patched forward reads them only there (and stock code that still
# looks at them, e.g. generate()'s bookkeeping, then reads host memory instead of the device).
_HOST_ONLY = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")


def _spec(model) -> ModelSpec:
    if model is None:
        return _QWEN3_VL_DEFAULT
    if isinstance(model, ModelSpec):
        return model
    config = getattr(model, "config", model)
    if not hasattr(config, "vision_config"):  # a vision tower alone, or a PEFT wrapper
        for module in getattr(model, "modules", lambda: [])():
            if hasattr(getattr(module, "config", None), "vision_config"):
                config = module.config
                break
    return ModelSpec.from_config(config)


def prepare(batch: Mapping, device: str | torch.device | None = None, model=None) -> dict:
    """Validate a processor batch, plan the forward on the host, and move it to ``device``.

    ``batch`` is the processor's output (a ``BatchFeature`` or a dict) with tensors on the
    CPU. ``model`` (or its config) supplies the merge size and token ids; without it the
    published Qwen3-VL values are assumed, and the forward checks them. Returns the kwargs
    for ``model(**kwargs)`` and ``model.generate(**kwargs)``; device tensors are moved
    with pinned, non-blocking copies. With ``device=None`` nothing is pinned or moved,
    which is what a ``DataLoader`` worker should do (no CUDA there); call ``prepare``
    again on its result in the main process to move it.
    """
    batch = dict(batch)
    plan = batch.pop("syncfree_plan", None)
    for name in _PLAN_INPUTS:
        value = batch.get(name)
        if isinstance(value, torch.Tensor) and value.device.type != "cpu" and plan is None:
            raise ValueError(f"syncfree.prepare expects the processor's CPU tensors, but {name} is on {value.device}; "
                             "call prepare() before moving the batch (or just call the patched model: it reads "
                             "the control tensors once)")
    if plan is None:
        plan = build_plan(_spec(model), **{k: batch.get(k) for k in _PLAN_INPUTS})
    if device is None or torch.device(device).type == "cpu":
        return {**batch, "syncfree_plan": plan}
    moved = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor) and name not in _HOST_ONLY and value.device.type == "cpu":
            value = value.pin_memory().to(device, non_blocking=True)
        moved[name] = value
    moved["syncfree_plan"] = plan.to(device) if plan.device == "cpu" else plan
    return moved
