"""Moving a plan's tensors to the device without a wait: one helper for every part of a plan."""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["move", "DeviceFields"]


def move(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device``: pinned + non_blocking, so the copy is queued and the host goes on (no wait, no sync)."""
    if device is None or torch.device(device).type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


class DeviceFields:
    """For a plan dataclass whose tensors are named in ``_TENSORS`` (the rest stays on the host)."""

    _TENSORS: tuple[str, ...] = ()

    def to(self, device):
        moved = {f: move(getattr(self, f), device) for f in self._TENSORS if getattr(self, f) is not None}
        return dataclasses.replace(self, **moved, device=str(torch.device(device)))

    def pin_memory(self):
        """The same plan with its host tensors pinned (what a ``DataLoader`` with ``pin_memory=True`` calls)."""
        return dataclasses.replace(self, **{f: getattr(self, f).pin_memory() for f in self._TENSORS
                                            if getattr(self, f) is not None})
