"""The generic fix: the per-block vision attention split, in any family syncfree does not fully support.

About 35 model families of Transformers copied one family's vision attention, whose non-flash path splits
the packed sequence with ``lengths.tolist()`` in every block, for q, k and v. Where a module's forward
holds that exact code (``lengths = cu_seqlens[1:] - cu_seqlens[:-1]`` and one ``lengths.tolist()``),
the line is rewritten so the sizes are read once per tower call (every block is handed the same
``cu_seqlens``) instead of three times per block. Nothing else of the family is touched: its rope
index, placeholder checks and feature split keep their syncs (``syncfree audit`` lists them).
"""

from __future__ import annotations

import functools
import inspect

import torch

from .edits import GENERIC_SPLIT
from .targets import Target

__all__ = ["split_attention_targets", "has_split", "host_seqlens_towers", "GENERIC_NOTE"]

GENERIC_NOTE = ("the vision attention split is read once per vision-tower call instead of in every block; the "
                "rest of the forward (rope index, placeholder checks, feature split, masks) is stock and keeps "
                "its syncs")


@functools.lru_cache(maxsize=None)
def has_split(fn) -> bool:
    """True when ``fn``'s own code is the packed split syncfree fixes generically."""
    if fn is None:
        return False
    try:
        source = inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return False
    return source.count("lengths.tolist()") == 1 and "lengths = cu_seqlens[1:] - cu_seqlens[:-1]" in source


def split_attention_targets(model: torch.nn.Module) -> list[tuple[type, Target]]:
    """The module classes in ``model`` whose own ``forward`` holds the packed split, with their targets."""
    found = []
    for cls in dict.fromkeys(type(m) for m in model.modules()):
        fn = cls.__dict__.get("forward")
        if has_split(fn):
            found.append((cls, Target(cls.__name__, "forward", edits=GENERIC_SPLIT)))
    return found


@functools.lru_cache(maxsize=None)
def _makes_host_seqlens(fn) -> bool:
    try:
        source = inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return False
    return "grid_thw.cpu()" in source and "cu_seqlens = " in source


def host_seqlens_towers(model: torch.nn.Module) -> list[str]:
    """Classes in ``model`` whose forward makes the attention's ``cu_seqlens`` from a host copy of its grid
    (Inkling2): their split reads the host, so the generic fix has nothing to remove there."""
    return [cls.__name__ for cls in dict.fromkeys(type(m) for m in model.modules())
            if _makes_host_seqlens(cls.__dict__.get("forward"))]
