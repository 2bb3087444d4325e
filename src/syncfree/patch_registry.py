"""How a model's family is found from the classes it holds, and where a target's class is installed. What
``syncfree.patch`` has replaced is in the registry (``plan.registry.REGISTRY``: ``patching`` fills it,
``patch_report`` reads it back)."""

from __future__ import annotations

import importlib
import importlib.util

import torch

from .families import FAMILIES
from .rewrite.targets import Family, Target

__all__ = ["INHERITED", "target_class", "family_classes", "family_of", "model_types", "installed"]

INHERITED = object()  # marks a class attribute that was inherited before the class was patched


def target_class(family: Family, target: Target) -> type | None:
    """The installed class ``target`` names (its own module's, else the family's; the fallback name in older
    releases), or None."""
    module = importlib.import_module(target.module or family.modeling)
    return getattr(module, target.cls, None) or getattr(module, target.fallback_cls or "", None)


def installed(modeling: str) -> bool:
    """True when the installed Transformers has this modeling module (False for a family newer than the release)."""
    try:
        return importlib.util.find_spec(modeling) is not None
    except ModuleNotFoundError:  # its model folder itself is absent (find_spec imports the parent package)
        return False


def family_classes(family: Family) -> tuple[type, ...]:
    """The classes of ``family`` that syncfree patches (as the installed Transformers names them)."""
    if not installed(family.modeling):
        return ()
    return tuple(cls for cls in (target_class(family, t) for t in family.targets if not t.borrowed)
                 if isinstance(cls, type))


def family_of(model: torch.nn.Module) -> Family | None:
    held = tuple({type(m) for m in model.modules()})
    for module in model.modules():
        config = getattr(module, "config", None)
        model_type = getattr(config, "model_type", None) or ""
        # A vision tower or text model alone carries the sub-config's type ("qwen3_vl_vision").
        # (An Omni thinker's towers: "qwen3_omni_moe_vision_encoder", "..._audio_encoder"; Qwen3-ASR's encoder:
        # "qwen3_asr_encoder".)
        for name in (model_type, model_type.removesuffix("_vision"), model_type.removesuffix("_text"),
                     model_type.replace("_vision_encoder", "_thinker"), model_type.replace("_audio_encoder", "_thinker"),
                     model_type.removesuffix("_encoder")):
            # A model that only borrows a family's sub-model (MiniCPM-V 4.6 runs Qwen3.5's text model under
            # its own vision tower) is not that family: it must hold one of the classes syncfree patches.
            if name in FAMILIES and any(issubclass(t, family_classes(FAMILIES[name])) for t in held):
                return FAMILIES[name]
    # A copy of a family registered under another key (``patch(model, like=...)`` of a copy that kept the model type).
    for key, family in FAMILIES.items():
        if "@" in key and any(issubclass(t, family_classes(family)) for t in held):
            return family
    return None


def model_types(model: torch.nn.Module) -> list[str]:
    return sorted({getattr(getattr(m, "config", None), "model_type", None) or "" for m in model.modules()} - {""})
