"""Stock objects an operator calls, found inside it by a key the graph holds as a constant.

A custom operator takes tensors, ints and the like, never a function or a module: where an operator runs a stock
function or a module's own method (the very code the eager forward runs, so the outputs are the eager ones bit for
bit), the traced forward hands it ``key_of(obj)`` instead. Dynamo runs ``key_of`` once while it traces
(``assume_constant_result``), so the graph holds the key as a constant; the operator then finds the object by it
(``keyed``). The object is held weakly: a model's modules and Transformers' module-level functions outlive its graphs.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["key_of", "keyed"]

_OBJECTS: dict[int, weakref.ref] = {}


@torch._dynamo.assume_constant_result
def key_of(obj) -> int:
    """The key of ``obj`` (a function or a module) an operator takes; a constant of the traced graph."""
    _OBJECTS[id(obj)] = weakref.ref(obj)
    return id(obj)


def keyed(key: int):
    """The object ``key_of`` gave ``key`` for."""
    return _OBJECTS[key]()
