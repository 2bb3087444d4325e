"""Moving a plan's tensors to the device without a wait: one helper for every part of a plan."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

__all__ = ["move", "DeviceFields", "same_host_values", "host_array"]


def move(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device``: pinned + non_blocking, so the copy is queued and the host goes on (no wait, no sync)."""
    if device is None or torch.device(device).type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def host_array(t: torch.Tensor) -> np.ndarray:
    """A host tensor's values as a NumPy array (no copy; booleans as 0/1 integers)."""
    values = t.detach().numpy()
    return values.astype(np.int64) if values.dtype == np.bool_ else values


def same_host_values(value, kept) -> bool:
    """True when ``value`` is ``kept`` itself, or a host tensor with its shape and values (``kept`` a tensor).
    A device tensor is never compared: reading it would wait for the device."""
    if value is kept:
        return True
    if not (isinstance(value, torch.Tensor) and isinstance(kept, torch.Tensor) and value.device.type == "cpu"
            and value.shape == kept.shape):
        return False
    if _NUMPY_FREE.isdisjoint((value.dtype, kept.dtype)) and not (value.is_complex() or kept.is_complex()):
        # (in NumPy: no PyTorch op, so on a CPU "device" checking a plan adds none to the forward's)
        return bool(np.array_equal(host_array(value), host_array(kept)))
    return torch.equal(value, kept)


_NUMPY_FREE = frozenset({torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2})  # (dtypes NumPy cannot hold)
_NUMPY_OF = {torch.int16: np.int16, torch.int32: np.int32}


class DeviceFields:
    """For a plan dataclass whose tensors are named in ``_TENSORS`` and whose sub-plans (themselves
    ``DeviceFields``) are named in ``_PARTS``; the rest stays on the host."""

    _TENSORS: tuple[str, ...] = ()
    _PARTS: tuple[str, ...] = ()
    # int64 tensors among ``_TENSORS`` whose values fit in fewer bits (token positions, per-item tables): they travel
    # as int16 where every value fits, else int32 where every value fits (a quarter or half the bytes), and are widened
    # back to int64 on the device (one elementwise op there; the same values).
    _NARROW: tuple[str, ...] = ()

    def _present(self, names: tuple[str, ...]) -> dict:
        return {f: getattr(self, f) for f in names if getattr(self, f) is not None}

    def _narrow_dtype(self, name: str, t: torch.Tensor):
        """The dtype ``t`` travels in, narrowed (``_NARROW``), or None: its own. (Host tensors, read in NumPy: no
        device read, no PyTorch op.)"""
        if name not in self._NARROW or t.dtype != torch.int64 or t.device.type != "cpu" or t.numel() == 0:
            return None
        values = host_array(t)
        low, high = int(values.min()), int(values.max())
        if -2**15 <= low and high < 2**15:
            return torch.int16
        return torch.int32 if -2**31 <= low and high < 2**31 else None

    def to(self, device):
        on_device = device is not None and torch.device(device).type != "cpu"
        moved = {}
        for f, t in self._present(self._TENSORS).items():
            narrow = self._narrow_dtype(f, t) if on_device else None
            moved[f] = (move(t, device) if narrow is None else
                        move(torch.from_numpy(host_array(t).astype(_NUMPY_OF[narrow])), device).to(torch.int64))
        moved.update({f: part.to(device) for f, part in self._present(self._PARTS).items()})
        return dataclasses.replace(self, **moved, device=str(torch.device(device)))

    def nbytes(self) -> int:
        """Bytes of the tensors this plan moves to the device with its batch (its parts' included)."""
        own = 0
        for f, t in self._present(self._TENSORS).items():
            narrow = self._narrow_dtype(f, t)
            own += t.numel() * (t.element_size() if narrow is None else narrow.itemsize)
        return own + sum(part.nbytes() for part in self._present(self._PARTS).values())

    def pin_memory(self):
        """The same plan with its host tensors pinned (what a ``DataLoader`` with ``pin_memory=True`` calls)."""
        pinned = {f: t.pin_memory() for f, t in self._present(self._TENSORS).items()}
        pinned.update({f: part.pin_memory() for f, part in self._present(self._PARTS).items()})
        return dataclasses.replace(self, **pinned)
