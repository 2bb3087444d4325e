"""A sync-free proof, on the device, that a batch's control tensors are the ones its plan was made from.

On the host a plan compares the values themselves with its own copies. On the device reading them would
make the host wait, so the plan carries a checksum per control tensor instead, computed on the host when
the plan is made and moved to the device with it; the forward computes the same checksum of the tensors it
is given, on the device, and ``torch._assert_async`` compares the two there. A batch edited, replaced,
re-padded or concatenated after its plan was made never runs under that plan: on a GPU the mismatch is a
device-side assert (the CUDA context is lost: loud, asynchronous, no wait); on the CPU and on the emulated
device it raises at once.

The checksum is keyed: ``sum(v_i * w_i)`` over the flattened tensor in 64-bit integers (wrapping, so exact in
every order and on every device), where each plan draws its own random odd 64-bit weights ``w_i`` on the host.
Integers and booleans count by value; floats (a video's seconds per grid) by the two 32-bit halves of their
float64 value. The guarantee, in one sentence: a change of one value is always caught (an odd weight is
invertible modulo 2**64), and any other edit, fixed before the plan drew its weights, keeps the checksum with
probability at most 2**(t - 63), where 2**t is the largest power of two dividing every changed value's
difference (2**-63 when one of them changes by an odd amount, as any edit of a 0/1 mask does).

The weights travel with the checksums in one tensor (``Plan.checksums``: the sums, then the weights), so they
reach the device in the plan's own pinned, non-blocking copy: one int64 per value of the largest control tensor
(tokens, not patches). The device check is one multiply and one sum for the tensors of one length (the
token-shaped ones together), and one comparison and one assert per tensor.
"""

from __future__ import annotations

import numpy as np
import torch

from .errors import StalePlan, stale
from .tensors import host_array

__all__ = ["host_checksums", "assert_given_match"]

# The table has one checksum per control tensor the plan keeps (``Plan.host``, in its order: ``hooks.plan_inputs()``
# when the plan was made), then the weights.


def _checkable(t) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_complex()


def _length(t: torch.Tensor) -> int:
    """How many 64-bit integers ``_as_int64`` makes of ``t`` (two per float)."""
    return t.numel() * (2 if t.dtype.is_floating_point else 1)


def _as_int64(t: torch.Tensor) -> torch.Tensor:
    """The flattened values as int64: integers and booleans by value, floats as the two int32 halves of their
    float64 bits (halves, so that an edit of a float's exponent or sign is not a multiple of a high power of two)."""
    flat = t.reshape(-1)
    if t.dtype.is_floating_point:
        return flat.to(torch.float64).view(torch.int32).to(torch.int64)
    return flat.to(torch.int64)


def _checksum(t: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The keyed checksum of ``t`` with ``weights`` (at least ``_length(t)`` of them), where ``t`` lives."""
    flat = _as_int64(t)
    return (flat * weights[:flat.numel()]).sum()


def _host_int64(t: torch.Tensor) -> np.ndarray:
    if t.dtype.is_floating_point:  # (NumPy has no bfloat16: PyTorch widens it)
        return t.detach().reshape(-1).to(torch.float64).numpy().view(np.int32).astype(np.int64)
    return host_array(t).reshape(-1).astype(np.int64, copy=False)


def _host_checksum(t: torch.Tensor, weights: np.ndarray) -> int:
    """``_checksum`` of a host tensor, in NumPy (a fraction of PyTorch's fixed cost per op). int64 products and
    sums wrap modulo 2**64 in NumPy as on every PyTorch device, so the two agree."""
    flat = _host_int64(t)
    with np.errstate(over="ignore"):
        return int(np.dot(flat, weights[:flat.shape[0]]))


def _draw_weights(n: int) -> np.ndarray:
    """``n`` random odd 64-bit weights, from a generator seeded afresh from the OS (so DataLoader workers forked
    from one process draw different ones)."""
    info = np.iinfo(np.int64)
    return np.random.default_rng().integers(info.min, info.max, size=n, dtype=np.int64, endpoint=True) | 1


def host_checksums(host: dict) -> torch.Tensor:
    """The plan's checksum table, from its host copies: one keyed checksum per entry of ``host`` (0 where the plan
    has no such tensor), then the plan's own random weights."""
    kept = [t if _checkable(t) else None for t in host.values()]
    weights = _draw_weights(max([_length(t) for t in kept if t is not None], default=0))
    sums = np.array([_host_checksum(t, weights) if t is not None else 0 for t in kept], dtype=np.int64)
    return torch.from_numpy(np.concatenate([sums, weights]))


def assert_given_match(plan, given: dict, host_too: bool = False) -> None:
    """Check, on the device and without a wait, that the device control tensors in ``given`` are the plan's.

    Host tensors are not looked at here unless ``host_too`` (the eager callers compare them by value, which a
    compiled graph cannot: there the checksum is computed in the graph for them too); tensors whose shape already
    differs from the plan's raise ``ValueError`` at once (shapes and dtypes are known on the host)."""
    table = plan.checksums
    weights = table[len(plan.host):]
    groups: dict[tuple, list[tuple[int, str, torch.Tensor]]] = {}
    for i, name in enumerate(plan.host):
        value, kept = given.get(name), plan.host.get(name)
        if not (_checkable(value) and _checkable(kept)) or (value.device.type == "cpu" and not host_too):
            continue
        if tuple(value.shape) != tuple(kept.shape):
            if name == "attention_mask" and value.dim() != 2:
                continue  # 4D masks are the text model's business; the plan holds the 2D padding mask only
            raise ValueError(f"{name} of shape {tuple(value.shape)} is not the one of shape {tuple(kept.shape)} its "
                             "syncfree plan was built for; call syncfree.prepare() on the batch you pass")
        if value.dtype.is_floating_point != kept.dtype.is_floating_point:
            raise StalePlan(stale(name, f"became {value.dtype} (the plan was built from {kept.dtype})"))
        groups.setdefault((value.device, _length(value)), []).append((i, name, value))
    for group in groups.values():
        for (_, name, _), same in zip(group, _checksums_equal(group, table, weights)):
            torch._assert_async(same, f"syncfree: {name} differs from the batch its plan was built for (edited, "
                                      "replaced or re-padded after syncfree.prepare()); call syncfree.prepare() on "
                                      "the batch you pass")


def _checksums_equal(group: list, table: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    """For each (index in the plan's host inputs, name, tensor) of ``group`` (tensors of one length on one device), whether its
    checksum is the plan's: 0-d booleans on the device. Tensors of one length (input ids, their token types and
    the padding mask) are summed together: one multiply and one sum for them all (each op a kernel launch)."""
    if len(group) == 1:
        (i, _, value), = group
        return [_checksum(value, weights) == table[i]]
    stacked = torch.stack([_as_int64(value) for _, _, value in group])
    sums = (stacked * weights[:stacked.shape[1]]).sum(1)
    first, step = group[0][0], group[1][0] - group[0][0]
    if all(i == first + k * step for k, (i, _, _) in enumerate(group)):  # (a strided slice of the table: a view)
        same = sums == table[first:first + step * (len(group) - 1) + 1:step]
        return list(same.unbind())
    return [sums[k] == table[i] for k, (i, _, _) in enumerate(group)]
