"""The replacements syncfree makes outside any one model, held while something needs them and undone after.

Two things a patch cannot scope to one model:

- the module-level functions every model shares (``masking_utils``' SDPA shortcut, the cache layers' moves of
  0-d tensors, ...): replaced in Transformers' modules, for the whole process;
- the pickling hook for bound methods (``copyreg``), which stores a patched method by name, so that a pickled
  model is patched again, checks included, when it is loaded.

Each is installed while at least one holder needs it: the class-level patch, or a patched model (or a part of one,
deep-copied or unpickled) that is alive and not unpatched. A patched model's modules keep a ``Hold`` in their
``__dict__``: it dies with them, and a deep copy or an unpickled copy of them makes a ``Hold`` of its own. When the
last holder lets go (``unpatch``, or a patched model garbage-collected), the stock objects are put back exactly and
the pickling hook is taken out, with whatever ``copyreg`` had before restored. The hook applies to syncfree's
methods only; every other bound method is reduced as before it. One lock guards this state and ``patch`` /
``unpatch`` (``critical``), so they can be called from several threads. A holder that dies inside a critical section
(the garbage collector runs where it likes) is let go when the section ends, never in the middle of an install or a
restore.
"""

from __future__ import annotations

import contextlib
import copyreg
import sys
import threading
import types
import weakref

from .plan.registry import REGISTRY

__all__ = ["critical", "CLASS_LEVEL", "HOLD_ATTR", "Hold", "hold", "release", "holders"]

_LOCK = threading.RLock()
_depth = [0]  # how deep the current critical section is (under _LOCK)
_dead: list[int] = []  # holders that died while a critical section ran: let go when it ends
CLASS_LEVEL = object()  # the class-level patch's holder key (it never dies: released by ``unpatch()`` alone)

_holders: dict[int, weakref.finalize | None] = {}  # id(holder) -> what releases it when it dies (None: class level)
_hook: dict = {}  # "previous": copyreg's reducer for bound methods before syncfree's ("absent" if none), "ours"


HOLD_ATTR = "_syncfree_hold"  # where a patched module keeps its ``Hold``


class Hold:
    """What a patched model keeps so the shared replacements stay while it lives: one per ``patch(model)``, in the
    ``__dict__`` of every module it patched. Copying a module (``copy.deepcopy``) or unpickling it makes a new one,
    which holds on its own; garbage collection of the last module referring to it lets go."""

    __slots__ = ("reduce_patched", "__weakref__")

    def __init__(self, reduce_patched) -> None:
        self.reduce_patched = reduce_patched
        hold(self, {}, reduce_patched)

    def __deepcopy__(self, memo) -> Hold:
        return Hold(self.reduce_patched)

    def __reduce__(self):
        return Hold, (self.reduce_patched,)


@contextlib.contextmanager
def critical():
    """The patch state's lock; holders that die meanwhile are let go as it is left."""
    with _LOCK:
        _depth[0] += 1
        try:
            yield
        finally:
            while _depth[0] == 1 and _dead:  # (still inside: a death during the drain waits its turn here)
                _release_key(_dead.pop())
            _depth[0] -= 1


def _died(key: int) -> None:
    """A holder was garbage-collected (called by its finalizer, anywhere, in any thread)."""
    _dead.append(key)
    if _depth[0] == 0:
        with critical():
            pass


def holders() -> int:
    """How many holders keep the shared replacements installed."""
    with critical():
        return len(_holders)


def hold(holder, built: dict, reduce_patched) -> None:
    """Install ``built`` (module-level replacements not installed yet: (module, function) -> (stock, replacement,
    the class holding it for a method, else None)) and the pickling hook, on behalf of ``holder``.
    ``reduce_patched(method)`` is how a syncfree method pickles (None for any other method)."""
    with critical():
        _install(built)
        key = id(holder)
        if key not in _holders:
            _holders[key] = None if holder is CLASS_LEVEL else weakref.finalize(holder, _died, key)
        _hook_pickling(reduce_patched)


def release(holder) -> None:
    """``holder`` no longer needs the shared replacements; the last one out restores the stock objects."""
    with critical():
        _release_key(id(holder))


def _release_key(key: int) -> None:
    """(Inside a critical section.)"""
    if key not in _holders:
        return
    finalizer = _holders.pop(key)
    if finalizer is not None:
        finalizer.detach()
    if not _holders:
        _restore()
        _unhook_pickling()


def _install(built: dict) -> None:
    """In every loaded Transformers module holding the stock function (at every hold: a family module imported
    since then gets them too). Nothing here can fail."""
    for (module_name, name), (stock, replacement, holder) in built.items():
        REGISTRY.module_patches[(module_name, name)] = (stock, replacement, [])
        if holder is not None:  # a class's method: the class is its one holder
            setattr(holder, name.rpartition(".")[2], replacement)
            REGISTRY.module_patches[(module_name, name)][2].append(holder)
    for (_module_name, name), (stock, replacement, holders_of) in REGISTRY.module_patches.items():
        if "." in name:
            continue
        for m_name, module in list(sys.modules.items()):
            if m_name.startswith("transformers") and getattr(module, "__dict__", {}).get(name) is stock:
                setattr(module, name, replacement)
                holders_of.append(module)


def _restore() -> None:
    for (module_name, name), (stock, _, holders_of) in list(REGISTRY.module_patches.items()):
        for holder in holders_of:
            setattr(holder, name.rpartition(".")[2], stock)
        del REGISTRY.module_patches[(module_name, name)]


def _hook_pickling(reduce_patched) -> None:
    if "ours" in _hook:
        return
    previous = copyreg.dispatch_table.get(types.MethodType)

    def reduce_method(method):
        reduced = reduce_patched(method)
        if reduced is not None:
            return reduced
        return previous(method) if previous is not None else method.__reduce__()

    _hook.update(previous=previous, ours=reduce_method)
    copyreg.pickle(types.MethodType, reduce_method)


def _unhook_pickling() -> None:
    if "ours" not in _hook:
        return
    if copyreg.dispatch_table.get(types.MethodType) is _hook["ours"]:
        if _hook["previous"] is None:
            del copyreg.dispatch_table[types.MethodType]
        else:
            copyreg.dispatch_table[types.MethodType] = _hook["previous"]
    _hook.clear()
