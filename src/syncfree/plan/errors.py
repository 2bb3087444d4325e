"""Errors for inputs stock rejects too, typed so that code written against stock keeps catching them.

Each is a ``ValueError`` (syncfree's own contract: a bad input is named in one line) and also the type
stock raises for the same input, from deeper inside its forward (``except RuntimeError`` around a stock
call still catches a bad grid when syncfree finds it first)."""

from __future__ import annotations

__all__ = ["GridError", "GridShapeError", "GridDtypeError", "MaskShapeError", "InputsNotTaken", "StalePlan", "stale"]


class GridError(ValueError, RuntimeError, IndexError):
    """A grid stock cannot lay out (a size of 0, or not a multiple of the merge size): stock's reshapes and
    size checks raise ``RuntimeError``; some families' indexing of an empty grid ``IndexError``."""


class GridShapeError(ValueError, IndexError):
    """A grid that is not (N, 3) (a column short, say): stock's ``grid[:, 2]`` and its row unpacking raise
    ``IndexError`` (most families) or ``ValueError``."""


class GridDtypeError(ValueError, NotImplementedError, TypeError):
    """A grid of floats: a tower's ``repeat_interleave`` has no kernel for it (``NotImplementedError``), and another's
    ``reshape`` takes no float sizes (``TypeError``)."""


class MaskShapeError(ValueError, IndexError):
    """A 2D attention mask whose shape is not the tokens': stock's boolean-mask indexing raises ``IndexError``."""


class InputsNotTaken(ValueError):
    """A kind of batch a family's model cannot take at all (e.g. images and videos together), raised where
    syncfree builds processor-style inputs, so a benchmark or census lists it as not applicable."""


class StalePlan(ValueError):
    """The batch was changed after ``syncfree.prepare()``: the plan no longer describes it."""


def stale(name: str, what: str) -> str:
    """The one-line refusal of a stale plan: which control tensor changed, how, and what to do."""
    return (f"{name} {what} after syncfree.prepare(), so its plan no longer describes the batch; call "
            "syncfree.prepare() again on the changed batch")
