"""What ``torch.cuda`` answers inside ``emulate_cuda()``: one available device of compute capability 9.0.

The H100/H200 class these models are served on, so code that checks for CUDA or picks kernels
by capability takes its GPU path. ``emulate_cuda()`` sets these as attributes of ``torch.cuda``
and puts the real ones back on exit. Replacing a module attribute also changes what
``torch.cuda``'s own functions see, since they look these names up in that module's namespace.

Deliberately not stood in: ``torch.cuda.is_initialized()`` stays False. torch.cuda's own helpers
take True as "the CUDA runtime is up" and call into it (seeding in ``torch.manual_seed``,
``empty_cache``, memory statistics), which a CPU-only machine does not have; False only makes them
queue or skip that work. Streams, events, memory statistics and random-number state are not emulated.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import rules
from .events import SYNC

__all__ = ["CUDA_STANDINS", "EMULATED_CAPABILITY", "EMULATED_NAME", "EmulatedDeviceProperties"]

EMULATED_CAPABILITY = (9, 0)
EMULATED_NAME = "syncfree emulated CUDA device (sm_90)"


@dataclass(frozen=True)
class EmulatedDeviceProperties:
    """What ``torch.cuda.get_device_properties()`` answers while emulating (H100-like numbers)."""

    name: str = EMULATED_NAME
    major: int = EMULATED_CAPABILITY[0]
    minor: int = EMULATED_CAPABILITY[1]
    total_memory: int = 80 * 2**30
    multi_processor_count: int = 132
    is_integrated: bool = False
    is_multi_gpu_board: bool = False


def _synchronize(device=None) -> None:
    from .device_tensor import record  # (device_tensor imports the rules this module sits beside)

    record(SYNC, "torch.cuda.synchronize", rules.PYTHON_SYNC_RULES["torch.cuda.synchronize"],
           api="torch.cuda.synchronize")


def _set_device(device) -> None:
    # One device: selecting it is a no-op (training loops and Trainer select their device up front).
    import torch

    index = device if isinstance(device, int) else torch.device(device).index if not isinstance(device, torch.device) \
        else device.index
    if index not in (None, 0, -1):
        raise RuntimeError(f"the emulated CUDA device is cuda:0 only; torch.cuda.set_device({device!r}) asks for another")


CUDA_STANDINS = {
    "is_available": lambda: True,
    "_lazy_init": lambda: None,  # so factories such as torch.arange(n, device="cuda") reach the dispatch mode
    "synchronize": _synchronize,
    "get_device_capability": lambda device=None: EMULATED_CAPABILITY,
    "get_device_properties": lambda device=None: EmulatedDeviceProperties(),
    "is_bf16_supported": lambda including_emulation=True: True,
    "device_count": lambda: 1,
    "current_device": lambda: 0,
    "get_device_name": lambda device=None: EMULATED_NAME,
    "set_device": _set_device,
    "empty_cache": lambda: None,  # nothing is cached: device memory is host memory
}
