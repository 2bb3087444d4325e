"""Which plan describes the forward that is running: the registry of prepared batches and the active plan.

``prepare(batch, device)`` hands back the stock keyword arguments, nothing more (so the stock
signatures, ``generate()``'s argument checks and an unpatched model all keep working). The plan
travels beside them: it is registered under the very tensor objects ``prepare`` returned, with
their version counters. The patched forward finds it by the identity of the ``input_ids`` it is
given and checks, without reading the device, that the other control tensors are the ones the
plan was built from, unchanged: object identity always; on the host the values, compared with the
plan's own copies; on the device the version counter here and the plan's checksums on the device
(``checksum.py``). A batch edited after ``prepare()`` is refused, never silently planned for the old
values. The registry holds its keys weakly, and the plan holds copies, not the batch's tensors.

While a patched forward (or ``generate``) runs, its plan is *active* on this thread: the small
patched pieces deep inside the stock forward (placeholder counts, the deepstack merge, the SDPA
mask decision) look it up here instead of reading the device. Each piece checks that the
tensors it is handed are the ones the plan describes (identity or shape) before using it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass, field

import torch

from .batch import Plan, plan_inputs
from .errors import StalePlan, stale
from .tensors import same_host_values

__all__ = ["register", "registered", "attached", "PLAN_ATTR", "Entry", "activate", "current", "StalePlan", "expect", "expected"]


@dataclass
class _Registration:
    plan: Plan
    tensors: dict  # name -> (weakref to the tensor handed out, its _version then) or None when absent


_registry: dict[int, tuple[weakref.ref, _Registration]] = {}
PLAN_ATTR = "_syncfree_plan"  # the attribute of a prepared anchor tensor that holds its plan (for compiled forwards)
_lock = threading.Lock()


def _forget(key: int):
    # The dict and lock are bound here: at interpreter exit the module's globals may already be gone.
    def drop(_ref, registry=_registry, lock=_lock):
        with lock:
            registry.pop(key, None)
    return drop


def register(plan: Plan, kwargs: dict) -> None:
    """Remember ``plan`` for the control tensors in ``kwargs`` (the dict ``prepare`` returns)."""
    anchor = kwargs.get("input_ids")
    if anchor is None:
        anchor = kwargs.get("mm_token_type_ids")
    if not isinstance(anchor, torch.Tensor):
        return
    tensors = {}
    for name in plan_inputs():
        value = kwargs.get(name)
        tensors[name] = (weakref.ref(value), _version_of(value)) if isinstance(value, torch.Tensor) else None
    key = id(anchor)
    with _lock:
        _registry[key] = (weakref.ref(anchor, _forget(key)), _Registration(plan, tensors))
    # The same plan as an attribute of the anchor tensor, for a forward that ``torch.compile`` traces: Dynamo cannot
    # trace the registry's lookup by object identity, but it reads a tensor's attributes and guards on what it reads
    # (a batch of another layout recompiles; one of the same layout reuses the graph).
    setattr(anchor, PLAN_ATTR, plan)


def attached(anchor) -> Plan | None:
    """The plan ``register`` attached to ``anchor`` (``input_ids``, else ``mm_token_type_ids``), or None. Traceable
    by Dynamo, unlike ``registered``: it proves nothing about the other tensors (the caller checks them)."""
    return getattr(anchor, PLAN_ATTR, None) if isinstance(anchor, torch.Tensor) else None


def registered(anchor) -> _Registration | None:
    """The registration whose anchor tensor (``input_ids``, else ``mm_token_type_ids``) is ``anchor``."""
    if not isinstance(anchor, torch.Tensor):
        return None
    found = _registry.get(id(anchor))
    if found is None or found[0]() is not anchor:
        return None
    return found[1]


def check_unchanged(registration: _Registration, given: dict) -> None:
    """Raise ``StalePlan`` when a control tensor in ``given`` is not the one prepare() returned, unchanged."""
    for name, kept in registration.tensors.items():
        if name not in given:  # not passed to this call at all (e.g. generate() dropped it): nothing to compare
            continue
        value = given[name]
        if kept is None:
            if value is not None:
                raise StalePlan(stale(name, "was added"))
            continue
        ref, version = kept
        if value is None:
            raise StalePlan(stale(name, "was removed"))
        if value is not ref():
            raise StalePlan(stale(name, "was replaced by another tensor"))
        if value.device.type == "cpu":
            # On the host the values themselves are compared with the plan's own copy (a few small tensors):
            # that also catches edits that bump no version counter (``t.numpy()[...] = v``, ``t.data[...] = v``)
            # and inference tensors, which keep none.
            if not same_host_values(value, registration.plan.host.get(name)):
                raise StalePlan(stale(name, "was modified in place"))
        elif version is not None and value._version != version:
            # On the device reading the values would wait for it: the version counter tells instead.
            raise StalePlan(stale(name, "was modified in place"))


def _version_of(t: torch.Tensor) -> int | None:
    """The tensor's version counter; None for an inference tensor (``torch.inference_mode``), which has none."""
    return None if t.is_inference() else t._version


@dataclass
class Entry:
    """An active plan and the exact objects it was matched to in this call."""

    plan: Plan
    input_ids: torch.Tensor | None
    attention_mask: object = None
    in_generate: bool = False
    given: dict = field(default_factory=dict)  # the control tensors of the call, by name
    # Token ids the forward derived from ``input_ids`` whose rotary positions are still the plan's (an image generator's, with its
    # source images' VQ codes written into the placeholders: its index reads only the image start and end ids).
    rope_ids: object = None
    # In a traced forward: tensors a family's rewritten code derived from the call's control tensors (a per-frame grid,
    # halved crop sizes), each with what the plan knows of it: ``(tensor, vision plan or None, rows)``. Found again by
    # identity, as the call's own tensors are in ``given`` (``note`` / ``known``).
    derived: list = field(default_factory=list)
    # In a traced forward: the pixels it was given, by input name (what sizes the traced tables and features).
    pixels: dict = field(default_factory=dict)

    def note(self, tensor, vision_plan, rows: tuple) -> None:
        """Make ``tensor`` known to this call: the vision plan it is the grid of (None where it is no plan's), and its
        rows as Python ints (the same values as the tensor's)."""
        self.derived.append((tensor, vision_plan, rows))

    def known(self, tensor) -> tuple | None:
        """``(vision plan or None, rows)`` of a tensor ``note`` made known, or None."""
        for noted, vision_plan, rows in self.derived:
            if noted is tensor:
                return vision_plan, rows
        return None

    def owns(self, input_ids) -> bool:
        """True when ``input_ids`` is the tensor this plan was matched to (so its counts apply)."""
        return input_ids is not None and input_ids is self.input_ids

    def covers(self, mask: torch.Tensor) -> bool:
        """True when a (B, S) tensor has the plan's batch shape."""
        return tuple(mask.shape[:2]) == self.plan.shape


class _Local(threading.local):
    # (each thread starts with every stack present and empty: a traced forward then guards on their contents, never on
    # whether one was made yet, which would recompile the second call)
    def __init__(self) -> None:
        self.stack: list = []
        self.traced: list = []
        self.expected: list = []


_local = _Local()


def _slot() -> str:
    # A forward that Dynamo traces has a stack of its own: it never sees the plans of the eager calls around it (a
    # compiled decode step inside an eager generate() reads nothing of that call's plan, and so guards on nothing of
    # it), only the one ``rewrite.wrappers.traced_entry`` made for it.
    return "traced" if torch.compiler.is_compiling() else "stack"


def _stack() -> list:
    return getattr(_local, _slot())


@contextlib.contextmanager
def activate(entry: Entry):
    stack = _stack()
    stack.append(entry)
    try:
        yield entry
    finally:
        stack.pop()


def current() -> Entry | None:
    """The innermost active plan on this thread (in a traced forward: of that forward), or None."""
    stack = getattr(_local, _slot())
    return stack[-1] if stack else None


def generating() -> Entry | None:
    """The innermost active plan of a ``generate()`` call, or None."""
    for entry in reversed(_local.stack):
        if entry.in_generate:
            return entry
    return None


@contextlib.contextmanager
def expect(plan: Plan):
    """While the block runs, a patched forward that finds no plan of its own for a call of exactly ``plan``'s batch
    shape takes ``plan``, checked against the call as a plan passed as ``syncfree_plan`` is (host tensors by value,
    device tensors by checksum on the device, without a wait). For callers that build the model's inputs from a
    batch they planned, by copies and concatenations that keep no tensor of it (a trainer's loss batch)."""
    stack = _local.expected
    stack.append(plan)
    try:
        yield plan
    finally:
        stack.pop()


def expected() -> Plan | None:
    """The innermost plan of an ``expect`` block on this thread, or None."""
    stack = _local.expected
    return stack[-1] if stack else None
