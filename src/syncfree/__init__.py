"""syncfree: host-sync-free vision-language models in Transformers (the Qwen-VL family and the families that share
its vision code), and the proof.

    model = syncfree.patch(model)                     # same outputs, no host syncs in the forward
    kwargs = syncfree.prepare(processor_out, "cuda", model)
    model(**kwargs); model.generate(**kwargs)

    with syncfree.audit() as report: ...              # every sync and copy, by source line
    with syncfree.emulate_cuda(): ...                 # ... also on a machine without a GPU

    Trainer(..., data_collator=syncfree.planning_collator(collator, model))   # plans made in the DataLoader
    syncfree.planning_trainer(GRPOTrainer)(model=model, ...)                # plans made where the trainer moves

Importing syncfree imports neither torch nor Transformers (each public name loads on first use), never
initializes CUDA and never imports a Transformers ``modeling_*`` module; those load when a verb needs them.
"""

import importlib
import types

# Each public name and the module it lives in, imported on first use: ``import syncfree`` (and ``syncfree --help``)
# imports neither torch nor Transformers; a verb's first call does.
_EXPORTS = {
    "CudaUnavailable": ".audit", "EmulationUnavailable": ".audit", "Report": ".audit", "SyncError": ".audit",
    "assert_no_sync": ".audit", "audit": ".audit", "emulate_cuda": ".audit",
    "planning_collator": ".collate", "Buckets": ".buckets",
    "packing_collator": ".packing", "PackingCollator": ".packing",
    "compile_vision": ".compile_vision",
    "register_family": ".forks",
    "FamilyLeftStock": ".patching", "UnsupportedTransformers": ".patching", "is_patched": ".patching",
    "patch": ".patching", "unpatch": ".patching",
    "prepare": ".prepare",
    "Family": ".rewrite.targets", "Target": ".rewrite.targets", "Edit": ".rewrite.rewriter",
    "Layout": ".plan.spec", "PositionTable": ".plan.traits", "PlanHooks": ".plan.hooks",
    "TowerShape": ".plan.traits", "VideoLayout": ".plan.traits", "RotaryIndex": ".plan.traits",
    "AudioLayout": ".plan.traits",
    "planning_trainer": ".trainer_hook",
}


def _export(name: str):
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = globals()[name] = _export(name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


_assigned: dict = {}  # a function named like its module, assigned by the user (``mock.patch("syncfree.prepare")``)


def _named_like_its_module(name: str) -> property:
    """``syncfree.<name>``: the function, whatever the import system assigns when it imports the module of that name
    (a module is ignored; anything else a user assigns is kept, as on any module)."""

    def assign(self, value) -> None:
        if isinstance(value, types.ModuleType):
            return
        _assigned[name] = value

    return property(lambda self: _assigned[name] if name in _assigned else _export(name), assign)


class _Package(types.ModuleType):
    """``syncfree.audit``, ``syncfree.prepare`` and ``syncfree.compile_vision`` are functions named like the
    subpackages they live in. Importing a subpackage sets the package's attribute of its name to the module; as
    properties of the package's class these three names stay the functions (what ``from .audit import audit``
    gave when everything was imported at once)."""

    audit = _named_like_its_module("audit")
    prepare = _named_like_its_module("prepare")
    compile_vision = _named_like_its_module("compile_vision")


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _Package

__version__ = "0.1.0"

__all__ = [
    "patch",
    "unpatch",
    "is_patched",
    "prepare",
    "planning_collator",
    "Buckets",
    "packing_collator",
    "PackingCollator",
    "planning_trainer",
    "compile_vision",
    "audit",
    "assert_no_sync",
    "emulate_cuda",
    "Report",
    "SyncError",
    "CudaUnavailable",
    "EmulationUnavailable",
    "UnsupportedTransformers",
    "FamilyLeftStock",
    "register_family",
    "Family",
    "Target",
    "Edit",
    "Layout",
    "PositionTable",
    "TowerShape",
    "VideoLayout",
    "RotaryIndex",
    "AudioLayout",
    "PlanHooks",
    "__version__",
]
