"""Find every host sync and host/device copy in a PyTorch forward, on a GPU or an emulated one."""

from .api import SyncError, assert_no_sync, audit
from .cuda_engine import CudaUnavailable
from .emulate import DeviceTensor, emulate_cuda, is_emulating, real_cuda_available
from .events import Event, Frame
from .guard_shim import EmulationUnavailable
from .report import Report

__all__ = [
    "audit",
    "assert_no_sync",
    "emulate_cuda",
    "is_emulating",
    "real_cuda_available",
    "Report",
    "Event",
    "Frame",
    "DeviceTensor",
    "SyncError",
    "CudaUnavailable",
    "EmulationUnavailable",
]
