"""syncfree: a host-sync-free multimodal forward for Qwen-VL models in Transformers, and the proof.

    model = syncfree.patch(model)                     # same outputs, no host syncs in the forward
    kwargs = syncfree.prepare(processor_out, "cuda", model)
    model(**kwargs); model.generate(**kwargs)

    with syncfree.audit() as report: ...              # every sync and copy, by source line
    with syncfree.emulate_cuda(): ...                 # ... also on a machine without a GPU

    Trainer(..., data_collator=syncfree.planning_collator(collator, model))   # plans made in the DataLoader
    syncfree.planning_trainer(GRPOTrainer)(model=model, ...)                # plans made where the trainer moves

Importing syncfree never initializes CUDA and never imports a Transformers
``modeling_*`` module; those load when a verb needs them.
"""

from .audit import (
    CudaUnavailable,
    EmulationUnavailable,
    Report,
    SyncError,
    assert_no_sync,
    audit,
    emulate_cuda,
)
from .collate import planning_collator
from .compile_vision import compile_vision
from .forks import register_family
from .patching import FamilyLeftStock, UnsupportedTransformers, is_patched, patch, unpatch
from .prepare import prepare
from .rewrite.targets import Family, Target
from .trainer_hook import planning_trainer

__version__ = "0.1.0"

__all__ = [
    "patch",
    "unpatch",
    "is_patched",
    "prepare",
    "planning_collator",
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
    "__version__",
]
