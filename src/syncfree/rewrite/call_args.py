"""How a wrapper reads the call it intercepts: argument names, the batch shape and device, and whether a
plan fits it. Shared by every wrapper (``wrappers``; a family's own in its folder); reads nothing from the device."""

from __future__ import annotations

import inspect

import torch

__all__ = ["positional_names", "taken_inputs", "given_args", "same_device", "call_device", "call_shape", "fits"]


def positional_names(fn) -> tuple[str, ...]:
    """The names of ``fn``'s positional parameters after ``self``."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds)[1:]


def taken_inputs(fn, inputs) -> tuple[str, ...]:
    """The names in ``inputs`` that are named parameters of ``fn`` (not ones it would find in its ``**kwargs``)."""
    named = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = {p.name for p in inspect.signature(fn).parameters.values() if p.kind in named}
    return tuple(n for n in inputs if n in params)


def given_args(names, args, kwargs) -> dict:
    """The call's arguments by name (positional ones named by ``names``)."""
    given = dict(zip(names, args))
    given.update(kwargs)
    return given


def same_device(where: str, device: torch.device) -> bool:
    """True when ``device`` is the device named ``where`` (an index missing on either side matches any)."""
    d = torch.device(where)
    return d.type == device.type and (d.index is None or device.index is None or d.index == device.index)


def call_device(given: dict) -> torch.device | None:
    for name in ("input_ids", "inputs_embeds", "pixel_values", "pixel_values_videos", "attention_mask"):
        value = given.get(name)
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def call_shape(given: dict) -> tuple[int, int] | None:
    for name in ("input_ids", "inputs_embeds", "mm_token_type_ids"):
        value = given.get(name)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return tuple(value.shape[:2])
    return None


def fits(plan, shape) -> bool:
    """True when a (rows, width) call is the plan's batch, or each of its rows repeated (generate()'s expansion)."""
    return shape is not None and plan.shape[1] == shape[1] and shape[0] % plan.shape[0] == 0
