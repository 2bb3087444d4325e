"""Index tensors stock code builds on the host and then moves to the device (a resampler's frame pairs, a window
merger's order and boundaries): moved through pinned memory without blocking, the same values. Called from rewritten
code (``_syncfree.host_index_to``) and from wrappers alike.
"""

from __future__ import annotations

import torch

__all__ = ["host_index_to"]


def host_index_to(index: torch.Tensor, device) -> torch.Tensor:
    """``index.to(device)`` for an index tensor stock just built on the host: through pinned memory and without
    blocking (the pinned block stays reserved until the copy is done), the same values. Anything else as stock."""
    if (isinstance(index, torch.Tensor) and index.device.type == "cpu" and torch.device(device).type == "cuda"
            and not torch.compiler.is_compiling()):
        return index.pin_memory().to(device, non_blocking=True)
    return index.to(device)
