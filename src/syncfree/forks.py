"""Families from outside syncfree's table: a user's own (``register_family``) and copies of a supported family under
other names (``patch(model, like="qwen2_5_vl")``).

A ``trust_remote_code`` checkpoint or a downstream fork often ships a modeling file that is a copy of a supported
family's, with its module and class names changed (``Qwen2_5_VLVisionAttention`` -> ``MyVLVisionAttention``). The
edits match code, not names, so they apply to the copy as they are: what changes is where each target lives. A
target's class in the copy is found by the rename the copy made (the prefix that turns the supported family's model
class name into the copy's), else by code (the one class of the copy's module whose function the target's edits and
checks accept). The copy is then registered as a family of its own (its targets, and the supported family's input
layout under the copy's module), so ``prepare``, pickling and the reports know it like any other, for as long as a
model patched ``like=`` it is patched: ``unpatch`` of the last one puts the tables back as they were
(``register_scoped``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from typing import Callable

import torch

from .families import FAMILIES
from .plan.registry import REGISTRY
from .plan.spec import layout_of, register_layout
from .rewrite.targets import Family, Target

__all__ = ["register_family", "register_scoped", "family_like"]


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Add ``family`` (a ``syncfree.Family``: its model type, its ``Target`` s and its input ``Layout``) to the
    table ``patch`` and ``prepare`` read, as if syncfree shipped it. A model type already in the table is refused
    unless ``replace=True``. Returns the family."""
    if not isinstance(family, Family):
        raise TypeError(f"syncfree.register_family takes a syncfree.Family, got {type(family).__name__}")
    if family.model_type in FAMILIES and FAMILIES[family.model_type] != family and not replace:
        raise ValueError(f"syncfree.register_family: {family.model_type!r} is already a family syncfree patches "
                         "(pass replace=True to replace it)")
    FAMILIES[family.model_type] = family
    register_layout(family.model_type, family.layout)
    # (A vision tower alone is known by its module's name, ``modeling_<x>``: register the layout there too.)
    short = _tower_name(family)
    if layout_of(short) is None:
        register_layout(short, family.layout)
    return family


def _tower_name(family: Family) -> str:
    return family.modeling.rsplit(".", 1)[-1].removeprefix("modeling_")


def register_scoped(family: Family) -> Callable[[], None]:
    """Register ``family`` (``register_family(..., replace=True)``) until the returned release is called; the last
    release of a model type puts the family table and the layouts back as they were before the first
    (``REGISTRY.scoped``)."""
    return REGISTRY.scoped(family.model_type, (family.model_type, _tower_name(family)),
                           lambda: register_family(family, replace=True))


def _prefixes(base_names: set[str], model_cls: str) -> tuple[str, str] | None:
    """(the supported family's prefix, the copy's): from the longest class name ending the copy's model class shares."""
    best = None
    for name in base_names:
        n = 0
        while n < min(len(name), len(model_cls)) and name[-1 - n] == model_cls[-1 - n]:
            n += 1
        if n and (best is None or n > best[0]) and name[:-n] and model_cls[:-n]:
            best = (n, name[:-n], model_cls[:-n])
    return None if best is None else best[1:]


def _classes(module) -> dict[str, type]:
    return {name: value for name, value in vars(module).items()
            if isinstance(value, type) and value.__module__ == module.__name__}


def family_like(model: torch.nn.Module, like: str,
                refusal: Callable[[str, type, Target, object], Exception | None]) -> Family:
    """The family of ``model``, a copy of the supported family ``like`` under other names: each target moved to the
    copy's class, its own helpers ``like``'s. ``refusal(model_type, cls, target, namespace)`` is why the target's
    edits (compiled against ``like``'s ``Family.namespace``) and checks refuse ``cls``'s function (None where they
    accept it). Where the renamed class exists but its code differs, that refusal is
    raised (the message names the nearest code); a target found nowhere raises ``ValueError``. Not registered here:
    ``patch`` registers it (``register_scoped``) once nothing refuses."""
    if like not in FAMILIES:
        raise ValueError(f"syncfree.patch: like={like!r} is not a fully supported family (supported: "
                         f"{', '.join(FAMILIES)})")
    base = FAMILIES[like]
    module_name = type(model).__module__
    module = sys.modules[module_name]
    if module_name == base.modeling:
        return base
    model_type = getattr(getattr(model, "config", None), "model_type", None) or module_name.rsplit(".", 1)[-1]
    rename = _prefixes(set(_classes(importlib.import_module(base.modeling))), type(model).__name__)
    own = _classes(module)
    targets = []
    for target in base.targets:
        renamed = rename and target.cls.startswith(rename[0]) and rename[1] + target.cls[len(rename[0]):]
        cls = own.get(renamed) if renamed else None
        refused = refusal(model_type, cls, _in(target, cls), base.namespace) if cls is not None else None
        if cls is None or refused is not None:
            found = [c for c in own.values()
                     if _holds(c, target) and refusal(model_type, c, _in(target, c), base.namespace) is None]
            if len(found) != 1:
                if target.optional:
                    continue
                if refused is not None and not found:
                    raise refused
                raise ValueError(
                    f"syncfree.patch: {type(model).__name__} is not a copy of {like} that syncfree can patch: "
                    f"{'no' if not found else 'more than one'} class of {os.path.basename(inspect.getfile(module))} "
                    f"holds the code of {target.cls}.{target.attr} (found: {[c.__name__ for c in found]})")
            cls = found[0]
        targets.append(_in(target, cls))
    tower = base.layout.tower  # (the copy's module holds its tower too)
    tower = dataclasses.replace(tower, modeling=None) if tower.modeling is not None else tower
    layout = dataclasses.replace(base.layout, modeling=module_name, tower=tower)
    key = model_type if model_type not in FAMILIES or FAMILIES[model_type].modeling == module_name \
        else f"{model_type}@{module_name}"
    return Family(key, tuple(targets), layout, helpers=base.helpers)  # (registered by patch, once nothing refuses)


def _in(target: Target, cls: type) -> Target:
    """``target`` moved to ``cls`` of the copy's module."""
    return dataclasses.replace(target, cls=cls.__name__, module=None, fallback_cls=None)


def _holds(cls: type, target: Target) -> bool:
    names = (target.attr, *target.alt_attrs)
    return any(n in cls.__dict__ for n in names) or (target.inherited and any(hasattr(cls, n) for n in names))
