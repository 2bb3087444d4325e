"""The fully supported families, one folder per family group, and the registry that lists them.

A family group's ``__init__`` says everything syncfree knows of its families: ``FAMILIES`` (what is patched in
each, and how it lays out its inputs), ``PRESETS``, ``VISION_CLASSES`` and ``MODEL_CLASSES`` (how a preset
is built), ``handles`` / ``processor_batch`` (a processor-style batch), where its processor takes more than
text, images and videos, ``ITEMS`` and, in one group, ``ASSUMED_SPEC`` (the values ``prepare(batch)`` assumes
without a model). Adding a family group is adding its folder and its name in ``GROUP_NAMES``.
"""

from __future__ import annotations

import importlib

import torch

from ..items import VISUAL_ITEMS, check_items
from ..plan.spec import register_assumed_spec, register_layout
from ..rewrite.targets import Family
from .preset import Preset
from .shared import MODULE_TARGETS

__all__ = ["GROUPS", "GROUP_NAMES", "FAMILIES", "MODULE_TARGETS", "PRESETS", "Preset", "VISION_CLASSES", "MODEL_CLASSES",
           "processor_batch", "batch_to", "tiny_preset", "CENSUS_FIXES"]

# The registry: one entry per family group, the name of its folder here, in the order the family table lists them.
GROUP_NAMES = ("qwen_vl", "omni", "exaone", "glm", "cosmos", "paddle", "ernie", "cohere", "lfm", "videollama3",
               "hunyuan", "minimax", "glm5next", "qwen4exp", "muse", "minicpm", "kimi", "qwen3asr", "glm_image", "dots3",
               "llava_onevision1_5", "ovis2_5")
GROUPS = tuple(importlib.import_module(f"{__name__}.{name}") for name in GROUP_NAMES)

FAMILIES: dict[str, Family] = {f.model_type: f for group in GROUPS for f in group.FAMILIES}
PRESETS: dict[str, Preset] = {name: p for group in GROUPS for name, p in group.PRESETS.items()}
VISION_CLASSES: dict[str, str] = {t: name for group in GROUPS for t, name in group.VISION_CLASSES.items()}
MODEL_CLASSES: dict = {t: get for group in GROUPS for t, get in group.MODEL_CLASSES.items()}
# The census's config fixes (``census.fixes``), by model type: each group's own, for every type it knows.
CENSUS_FIXES: dict = {t: fix for group in GROUPS for t, fix in getattr(group, "CENSUS_FIXES", {}).items()}

for _family in FAMILIES.values():  # the plan knows a family's input layout only through this table
    register_layout(_family.model_type, _family.layout)
for _group in GROUPS:  # the values prepare(batch) assumes without a model: the one group that declares them
    if getattr(_group, "ASSUMED_SPEC", None) is not None:
        register_assumed_spec(_group.ASSUMED_SPEC)


def tiny_preset(model_type: str) -> str:
    """The name of the family's tiny random-weight preset (``<name>-tiny``, the real layout rules at test sizes), which
    its tests, the conformance suite and the demo build."""
    found = [name for name, p in PRESETS.items() if p.values["model_type"] == model_type and name.endswith("-tiny")]
    if len(found) != 1:
        raise ValueError(f"syncfree: {model_type!r} has {len(found)} tiny presets ({found}); a family declares one")
    return found[0]


def processor_batch(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                    pad_token_id: int | None = None) -> dict:
    """The processor-style CPU batch for ``samples`` under ``config``, laid out as that family's processor
    lays it out (a Qwen-VL processor's layout for a config no group claims)."""
    group = next((g for g in reversed(GROUPS) if g.handles(config)), GROUPS[GROUP_NAMES.index("qwen_vl")])
    # (Every builder checks its items too, for a direct call; here first, because a group's own processor rules (GLM's
    # image/video mix, PaddleOCR-VL's images only) walk the samples before its builder runs.)
    check_items(getattr(config, "model_type", config), samples, getattr(group, "ITEMS", VISUAL_ITEMS))
    return group.processor_batch(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id)


def batch_to(batch: dict, device) -> dict:
    """The batch with its tensors on ``device``, as ``processor(...).to(device)`` moves them; other entries
    (an Omni batch's ``use_audio_in_video`` flag) stay as they are."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
