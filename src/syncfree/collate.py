"""``planning_collator``: build the plan where the batch is built, in the ``DataLoader`` workers.

Training loops collate each micro-batch in worker processes, which have no CUDA. Wrapping the
collator there runs ``prepare(batch)`` without a device: the batch gains its plan (a picklable host
object under ``"syncfree_plan"``) and the main process does no planning work. Then either call
``prepare(batch, "cuda")`` in the loop, or let the loop move the batch as it does (HF ``Trainer``
moves every tensor and passes the rest through): the patched model takes the plan from its keyword
arguments, checks it against the inputs, and moves it along (pinned when the ``DataLoader`` pinned
the batch: ``Plan.pin_memory``).
"""

from __future__ import annotations

from typing import Any, Callable

from .plan.spec import ModelSpec
from .prepare import _spec, prepare

__all__ = ["PlanningCollator", "planning_collator"]


class PlanningCollator:
    """A data collator that returns its wrapped collator's batch with the syncfree plan added.

    Picklable (``DataLoader`` workers started with ``spawn`` receive a copy): it keeps the model's
    plan values (a ``ModelSpec``), not the model.
    """

    def __init__(self, collator: Callable[[list], Any], spec: ModelSpec | None) -> None:
        self.collator, self.spec = collator, spec

    def __call__(self, features: list) -> dict:
        return prepare(self.collator(features), None, self.spec)

    def __repr__(self) -> str:
        return f"PlanningCollator({self.collator!r})"


def planning_collator(collator: Callable[[list], Any], model=None) -> PlanningCollator:
    """Wrap a data collator (HF ``Trainer``/TRL's ``data_collator``, a ``DataLoader``'s ``collate_fn``) so
    each batch it makes carries its syncfree plan, built in the worker that collates it.

    ``model`` (or its config) gives the merge size and placeholder ids, as for ``prepare``.
    """
    if not callable(collator):
        raise ValueError(f"planning_collator() wraps a callable data collator, got {type(collator).__name__}")
    return PlanningCollator(collator, _spec(model, {}) if model is not None else None)
