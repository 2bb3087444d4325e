"""A sync-free proof, on the device, that a batch's control tensors are the ones its plan was made from.

On the host a plan compares the values themselves with its own copies. On the device reading them would
make the host wait, so the plan carries a checksum per control tensor instead, computed on the host when
the plan is made and moved to the device with it; the forward computes the same checksum of the tensors it
is given, on the device, and ``torch._assert_async`` compares the two there. A batch edited, replaced,
re-padded or concatenated after its plan was made never runs under that plan: on a GPU the mismatch is a
device-side assert (the CUDA context is lost: loud, asynchronous, no wait); on the CPU and on the emulated
device it raises at once.

The checksum is keyed: ``sum(h_j * w_j)`` in 64-bit integers (wrapping, so exact in every order and on every
device), where the ``h_j`` are the tensor's values cut into 32-bit halves (each value as 64 bits, integers
by value and floats by their float64 bits; each half sign-extended) and the ``w_j`` are random odd 64-bit
weights of the plan's own. The guarantee, for an edit fixed before the plan drew its key: a change of one
half is always caught (an odd weight is invertible modulo 2**64, and a half changes by less than 2**32); any
other edit keeps the checksum with probability at most 2**(t - 63), where 2**t is the largest power of two
dividing every changed half's difference: at most 2**-32 for any edit (a half's difference is below 2**32 in
size, so t <= 31), and 2**-63 when one value changes by an odd amount, as any edit of a 0/1 mask does. Halves,
not whole values: a sum of whole values weighted by odd numbers is blind to two values moved by 2**63 each
(2**63 * odd + 2**63 * odd = 2**64 * ... = 0 modulo 2**64), a half cannot move that far.

Nothing token-sized travels for the weights: they are a counter-based hash (SplitMix64's finalizer) of each
half's place, from a seed drawn once per process, XOR a key drawn per plan, made with the same integer ops
in NumPy on the host and in PyTorch on the device. The plan's table (``Plan.checksums``) is the sums, then
the seed and the key: a few int64 in the plan's own pinned, non-blocking copy. The device makes a plan's
weights once (a dozen elementwise ops, no wait), then checks with one multiply and one sum for the tensors
of one length (the token-shaped ones together), and one comparison and one assert per tensor.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

from .errors import StalePlan, stale
from .tensors import host_array

__all__ = ["host_checksums", "assert_given_match", "device_weights", "weights_length"]

# The table has one checksum per control tensor the plan keeps (``Plan.host``, in its order: ``hooks.plan_inputs()``
# when the plan was made), then SplitMix64's step and the seed and the key of its weights (``_STEP``, ``_SEED``,
# ``_KEY``: offsets from its end). The step travels with the table although it is a constant: a graph that multiplies
# a fresh ``arange`` by a constant this large is folded at compile time by Inductor, which corrupts memory (PyTorch
# 2.13, CPU); multiplied by a value of the table, the product is made when the graph runs.
_STEP, _SEED, _KEY = -3, -2, -1

# SplitMix64 (Steele, Lea and Flood 2014): a step of the golden ratio per place, then a finalizer that mixes every
# bit into every bit. Its constants are above 2**63: written here as the int64 of the same bits.
_GAMMA, _M1, _M2 = -7046029254386353131, -4658895280553007687, -7723592293110705685


def _shr(x, s: int):
    """``x`` shifted right by ``s`` as unsigned 64 bits (PyTorch and NumPy shift int64 arithmetically: the sign's
    copies are masked off)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mixed(places, seed, key, step=None):
    """The weights of ``places`` (int64 counters): SplitMix64 of ``seed`` stepped ``places`` times, XOR ``key``, odd.
    The same ops, bit for bit, on NumPy arrays (host) and PyTorch tensors (device; ``seed`` and ``key`` 0-d
    tensors there, so a traced graph does not specialise on them)."""
    z = places * (_GAMMA if step is None else step) + seed
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return (z ^ _shr(z, 31) ^ key) | 1


class _HostPlaces(threading.local):
    # (per thread: a plan may be made in several at once; per process: a forked DataLoader worker draws its own seed)
    def __init__(self) -> None:
        self.pid, self.seed, self.table = None, 0, np.zeros(0, np.int64)
        self.even = self.table  # (its even places, contiguous: the weights of values < 2**31, read on every plan)


_host = _HostPlaces()


def _host_hash(n: int) -> tuple[int, np.ndarray]:
    """This process's seed and at least ``n`` hashed places for it (without the key), grown by doubling."""
    if _host.pid != os.getpid():
        _host.pid, _host.seed, _host.table = os.getpid(), _random_int64(), np.zeros(0, np.int64)
        _host.even = _host.table
    if _host.table.shape[0] < n:
        with np.errstate(over="ignore"):
            _host.table = _mixed(np.arange(max(n, 2 * _host.table.shape[0], 1024), dtype=np.int64),
                                 np.int64(_host.seed), np.int64(0))
        _host.even = _host.table[0::2].copy()
    return _host.seed, _host.table


def _random_int64() -> int:
    """64 random bits from the OS (a forked worker draws its own), as a signed int64."""
    return int.from_bytes(os.urandom(8), "little", signed=True)


def _checkable(t) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_complex()


def _length(t: torch.Tensor) -> int:
    """How many halves ``_halves`` makes of ``t``: two per value."""
    return 2 * t.numel()


def _halves(t: torch.Tensor) -> torch.Tensor:
    """The flattened values as 64 bits (integers and booleans by value, floats by their float64 bits), cut into
    their two sign-extended 32-bit halves, as int64: one op beyond the widening."""
    wide = t.reshape(-1).to(torch.float64 if t.dtype.is_floating_point else torch.int64)
    return wide.view(torch.int32).to(torch.int64)


def _checksum(t: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The keyed checksum of ``t`` with ``weights`` (at least ``_length(t)`` of them), where ``t`` lives."""
    flat = _halves(t)
    return (flat * weights[:flat.numel()]).sum()


def _host_halves(t: torch.Tensor) -> np.ndarray:
    if t.dtype.is_floating_point:  # (NumPy has no bfloat16: PyTorch widens it)
        wide = t.detach().reshape(-1).to(torch.float64).numpy()
    else:
        wide = host_array(t).reshape(-1).astype(np.int64, copy=False)
    return wide.view(np.int32).astype(np.int64)


def _host_checksum(t: torch.Tensor, weights: np.ndarray) -> int:
    """``_checksum`` of a host tensor, in NumPy (a fraction of PyTorch's fixed cost per op). int64 products and
    sums wrap modulo 2**64 in NumPy as on every PyTorch device, so the two agree."""
    flat = _host_halves(t)
    with np.errstate(over="ignore"):
        return int(np.dot(flat, weights[:flat.shape[0]]))


def host_weights(n: int) -> tuple[int, int, np.ndarray]:
    """A fresh key's ``n`` weights on the host: (seed, key, weights)."""
    seed, table = _host_hash(n)
    key = _random_int64()
    return seed, key, table[:n] ^ np.int64(key) | np.int64(1)


def device_weights(table: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` weights of a plan's checksum table, made where the table lives (from its seed and key: no copy,
    no read)."""
    places = torch.arange(n, dtype=torch.int64, device=table.device)
    return _mixed(places, table[_SEED], table[_KEY], table[_STEP])


def weights_length(host: dict) -> int:
    """How many weights the checksums of ``host``'s tensors take: two per value of the longest."""
    return max([_length(t) for t in host.values() if _checkable(t)], default=0)


def _small_values(t: torch.Tensor) -> np.ndarray | None:
    """An integer or boolean host tensor's values as int64 where every one is in [0, 2**31) (token ids, types, a 0/1
    mask): their high halves are 0 and their low halves the values themselves; else None."""
    if t.dtype.is_floating_point:
        return None
    values = host_array(t).reshape(-1)
    if values.shape[0] and (values.min() < 0 or values.max() >= 2**31):
        return None
    return values.astype(np.int64, copy=False)


def host_checksums(host: dict) -> torch.Tensor:
    """The plan's checksum table, from its host copies: one keyed checksum per entry of ``host`` (0 where the plan
    has no such tensor), then the step, seed and key of the plan's own random weights.

    A tensor whose values are all in [0, 2**31) has every high half 0: its checksum is the dot product of its values
    with the even weights alone, the same number without splitting it into halves nor making the odd weights (the
    token-sized tensors are such, and were most of the checksums' host time)."""
    kept = [t if _checkable(t) else None for t in host.values()]
    n = weights_length(host)
    seed, table = _host_hash(n)
    key = _random_int64()
    mixed = np.int64(key)
    small = [_small_values(t) if t is not None else None for t in kept]
    full = None
    if any(t is not None and v is None for t, v in zip(kept, small)):
        full = table[:n] ^ mixed | np.int64(1)
    even = _host.even[:(n + 1) // 2] ^ mixed | np.int64(1) if any(v is not None for v in small) else None
    sums = []
    with np.errstate(over="ignore"):
        for t, values in zip(kept, small):
            if t is None:
                sums.append(0)
            elif values is not None:
                sums.append(int(np.einsum("i,i->", values, even[:values.shape[0]])))  # (np.dot's sum, quicker)
            else:
                sums.append(_host_checksum(t, full))
    return torch.tensor([*sums, _GAMMA, seed, key], dtype=torch.int64)


def assert_given_match(plan, given: dict, host_too: bool = False) -> None:
    """Check, on the device and without a wait, that the device control tensors in ``given`` are the plan's.

    Host tensors are not looked at here unless ``host_too`` (the eager callers compare them by value, which a
    compiled graph cannot: there the checksum is computed in the graph for them too); tensors whose shape already
    differs from the plan's raise ``ValueError`` at once (shapes and dtypes are known on the host)."""
    table = plan.checksums
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
        # (a traced forward sums every tensor of a device in one group, each padded to the longest: grouping by
        # length would make the graph depend on the lengths)
        traced = torch.compiler.is_compiling()
        groups.setdefault((value.device, None if traced else _length(value)), []).append((i, name, value))
    if not groups:
        return
    weights = _weights_of(plan, max(_length(value) for group in groups.values() for _, _, value in group))
    for group in groups.values():
        for (_, name, _), same in zip(group, _checksums_equal(group, table, weights)):
            torch._assert_async(same, f"syncfree: {name} differs from the batch its plan was built for (edited, "
                                      "replaced or re-padded after syncfree.prepare()); call syncfree.prepare() on "
                                      "the batch you pass")


def _weights_of(plan, n: int) -> torch.Tensor:
    """The plan's first ``n`` weights where its table lives: made there once per plan in eager (``generate()``'s
    steps share them), in the graph when traced."""
    if torch.compiler.is_compiling():
        return device_weights(plan.checksums, n)
    made = plan.weights_made.get("weights")
    if made is None or made.numel() < n:
        made = plan.weights_made["weights"] = device_weights(plan.checksums, n)
    return made


def _checksums_equal(group: list, table: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    """For each (index in the plan's host inputs, name, tensor) of ``group`` (tensors of one length on one device), whether its
    checksum is the plan's: 0-d booleans on the device. Tensors of one length (input ids, their token types and
    the padding mask) are summed together: one multiply and one sum for them all (each op a kernel launch)."""
    if len(group) == 1:
        (i, _, value), = group
        return [_checksum(value, weights) == table[i]]
    if torch.compiler.is_compiling():
        return _padded_checksums_equal(group, table, weights)
    stacked = torch.stack([_halves(value) for _, _, value in group])
    sums = (stacked * weights[:stacked.shape[1]]).sum(1)
    first, step = group[0][0], group[1][0] - group[0][0]
    if all(i == first + k * step for k, (i, _, _) in enumerate(group)):  # (a strided slice of the table: a view)
        same = sums == table[first:first + step * (len(group) - 1) + 1:step]
        return list(same.unbind())
    return [sums[k] == table[i] for k, (i, _, _) in enumerate(group)]


def _padded_checksums_equal(group: list, table: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    """``_checksums_equal`` of tensors of any lengths in a traced forward: each one's halves padded with zeros to the
    weights' length (a zero half adds nothing: each row's sum is that tensor's checksum), stacked, and summed in one
    reduction; the graph compiles one kernel for them all where a sum per tensor would compile one each (each kernel
    compiled by Inductor costs its own C++ build: the bulk of a whole-forward compile on a CPU)."""
    longest = weights.shape[0]
    stacked = torch.stack([torch.nn.functional.pad(halves, (0, longest - halves.shape[0]))
                           for halves in (_halves(value) for _, _, value in group)])
    same = (stacked * weights).sum(1) == torch.stack([table[i] for i, _, _ in group])
    return list(same.unbind())
