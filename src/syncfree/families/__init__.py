"""The fully supported families, one folder per family group, and the tables made of them.

A family group's ``__init__`` says everything syncfree knows of its families in one object, its ``GROUP``
(a ``FamilyGroup``): its families (what is patched in each, and how it lays out its inputs), presets (and how one is
built), display names, census fixes, the batch builder its processor's layout comes from, the items that processor
takes and, in one group, the spec ``prepare(batch)`` assumes without a model. Adding a family group is adding its
folder and its name in ``GROUP_NAMES``.
"""

from __future__ import annotations

import importlib

import torch

from ..items import check_items
from ..plan.registry import REGISTRY
from ..plan.spec import register_assumed_spec, register_layout
from ..rewrite.targets import Family
from .group import FamilyGroup
from .preset import Preset
from .shared import MODULE_TARGETS

__all__ = ["GROUPS", "GROUP_NAMES", "FamilyGroup", "FAMILIES", "MODULE_TARGETS", "PRESETS", "Preset", "VISION_CLASSES",
           "MODEL_CLASSES", "DISPLAY", "processor_batch", "batch_to", "tiny_preset", "CENSUS_FIXES"]

# One entry per family group, the name of its folder here, in the order the family table lists them.
GROUP_NAMES = ("qwen_vl", "omni", "exaone", "glm", "cosmos", "paddle", "ernie", "cohere", "lfm", "videollama3",
               "hunyuan", "minimax", "glm5next", "qwen4exp", "muse", "minicpm", "kimi", "qwen3asr", "glm_image", "dots3",
               "llava_onevision1_5", "ovis2_5")


def _group(name: str) -> FamilyGroup:
    group = importlib.import_module(f"{__name__}.{name}").GROUP
    if not isinstance(group, FamilyGroup):
        raise TypeError(f"syncfree.families.{name}.GROUP is a {type(group).__name__}, not a FamilyGroup")
    return group


GROUPS: tuple[FamilyGroup, ...] = tuple(_group(name) for name in GROUP_NAMES)

# The registry's table of families (``REGISTRY.families``, the one ``register_family`` and ``patch(like=...)`` add to).
FAMILIES: dict[str, Family] = REGISTRY.families
PRESETS: dict[str, Preset] = {name: p for group in GROUPS for name, p in group.presets.items()}
VISION_CLASSES: dict[str, str] = {t: name for group in GROUPS for t, name in group.vision_classes.items()}
MODEL_CLASSES: dict = {t: get for group in GROUPS for t, get in group.model_classes.items()}
DISPLAY: dict[str, str] = {t: shown for group in GROUPS for t, shown in group.display.items()}
# The census's config fixes (``census.fixes``), by model type: each group's own, for every type it knows.
CENSUS_FIXES: dict = {t: fix for group in GROUPS for t, fix in group.census_fixes.items()}

for _family in (f for group in GROUPS for f in group.families):  # the plan knows a family's layout only this way
    FAMILIES[_family.model_type] = _family
    register_layout(_family.model_type, _family.layout)
for _group in GROUPS:  # the values prepare(batch) assumes without a model: the one group that declares them
    if _group.assumed_spec is not None:
        register_assumed_spec(_group.assumed_spec)


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
    check_items(getattr(config, "model_type", config), samples, group.items)
    return group.processor_batch(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id)


def batch_to(batch: dict, device) -> dict:
    """The batch with its tensors on ``device``, as ``processor(...).to(device)`` moves them; other entries
    (an Omni batch's ``use_audio_in_video`` flag) stay as they are."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
