"""syncfree: a host-sync-free multimodal forward for Qwen-VL models in Transformers, and the proof.

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

__version__ = "0.1.0"

__all__ = [
    "audit",
    "assert_no_sync",
    "emulate_cuda",
    "Report",
    "SyncError",
    "CudaUnavailable",
    "EmulationUnavailable",
    "__version__",
]
