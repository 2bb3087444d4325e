"""A sync-free proof, on the device, that a batch's control tensors are the ones its plan was made from.

On the host a plan compares the values themselves with its own copies. On the device reading them would
make the host wait, so the plan carries a checksum per control tensor instead, computed on the host when
the plan is made and moved to the device with it; the forward computes the same checksum of the tensors it
is given, on the device, and ``torch._assert_async`` compares the two there. A batch edited, replaced,
re-padded or concatenated after its plan was made never runs under that plan: on a GPU the mismatch is a
device-side assert (the CUDA context is lost: loud, asynchronous, no wait); on the CPU and on the emulated
device it raises at once.

The checksum is ``sum(value_i * (i + 1))`` over the flattened tensor in 64-bit integers: exact (integer
sums wrap the same way in every order and on every device), and any change of one value or of the order
of two different values changes it.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .tensors import host_array

__all__ = ["CHECKED", "host_checksums", "assert_given_match"]

CHECKED = ("input_ids", "mm_token_type_ids", "attention_mask", "position_ids", "moe_mm_token_type_ids",
           "image_merge_sizes", "video_merge_sizes", "video_compression_mask", "input_values_mask",
           "input_features_mask", "chunk_sample_lengths")


def _checksum(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1).to(torch.int64)
    return (flat * torch.arange(1, flat.numel() + 1, device=flat.device, dtype=torch.int64)).sum()


def _checkable(t) -> bool:
    # Integer and boolean tensors only: a float mask's -inf has no defined integer value on every device.
    return isinstance(t, torch.Tensor) and not t.dtype.is_floating_point and not t.is_complex()


@functools.lru_cache(maxsize=8)
def _weights(n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.int64)


def _host_checksum(t: torch.Tensor) -> int:
    """``_checksum`` of a host tensor, in NumPy (a fraction of PyTorch's fixed cost per op). int64 products and
    sums wrap modulo 2**64 in NumPy as on every PyTorch device, so the two agree."""
    flat = host_array(t).reshape(-1).astype(np.int64, copy=False)
    with np.errstate(over="ignore"):
        return int(np.dot(flat, _weights(flat.shape[0])))


def host_checksums(host: dict) -> torch.Tensor:
    """One checksum per name in ``CHECKED`` (0 where the plan has no such tensor), from the plan's host copies."""
    return torch.from_numpy(np.array([_host_checksum(t) if _checkable(t) else 0
                                      for t in (host.get(name) for name in CHECKED)], dtype=np.int64))


def assert_given_match(plan, given: dict) -> None:
    """Check, on the device and without a wait, that the device control tensors in ``given`` are the plan's.

    Host tensors are not looked at here (the callers compare them by value); tensors whose shape already
    differs from the plan's raise ``ValueError`` at once (shapes are known on the host)."""
    for i, name in enumerate(CHECKED):
        value, kept = given.get(name), plan.host.get(name)
        if not (_checkable(value) and _checkable(kept)) or value.device.type == "cpu":
            continue
        if tuple(value.shape) != tuple(kept.shape):
            if name == "attention_mask" and value.dim() != 2:
                continue  # 4D masks are the text model's business; the plan holds the 2D padding mask only
            raise ValueError(f"{name} of shape {tuple(value.shape)} is not the one of shape {tuple(kept.shape)} its "
                             "syncfree plan was built for; call syncfree.prepare() on the batch you pass")
        torch._assert_async(_checksum(value) == plan.checksums[i],
                            f"syncfree: {name} differs from the batch its plan was built for (edited, replaced or "
                            "re-padded after syncfree.prepare()); call syncfree.prepare() on the batch you pass")
