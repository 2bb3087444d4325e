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

from .plan.spec import ModelSpec, multimodal_config
from .prepare import model_spec, prepare

__all__ = ["PlanningCollator", "planning_collator"]


class PlanningCollator:
    """A data collator that returns its wrapped collator's batch with the syncfree plan added.

    Picklable (``DataLoader`` workers started with ``spawn`` receive a copy): it keeps the model's
    plan values (a ``ModelSpec``), not the model.
    """

    def __init__(self, collator: Callable[[list], Any], spec: ModelSpec | None, buckets=None, config=None) -> None:
        self.collator, self.spec, self.buckets, self.config = collator, spec, buckets, config

    def __call__(self, features: list) -> dict:
        batch = self.collator(features)
        if self.buckets is not None:  # (padded first, then planned: the plan describes the bucketed batch)
            return prepare(batch, None, self.config, buckets=self.buckets)
        return prepare(batch, None, self.spec)

    def __repr__(self) -> str:
        return f"PlanningCollator({self.collator!r})"


def planning_collator(collator: Callable[[list], Any], model=None, *, buckets=None) -> PlanningCollator:
    """Wrap a data collator (HF ``Trainer``/TRL's ``data_collator``, a ``DataLoader``'s ``collate_fn``) so
    each batch it makes carries its syncfree plan, built in the worker that collates it.

    ``model`` (or its config) gives the merge size and placeholder ids, as for ``prepare``. ``buckets`` (a
    ``syncfree.Buckets``, with ``model``): each batch padded up to a bucket first (``syncfree.buckets``).
    """
    if not callable(collator):
        raise ValueError(f"planning_collator() wraps a callable data collator, got {type(collator).__name__}")
    config = multimodal_config(model)
    if buckets is not None and config is None:
        raise ValueError("planning_collator(..., buckets=...) needs the model (or its config): its processor's "
                         "layout of an image")
    return PlanningCollator(collator, model_spec(model, {}) if model is not None else None, buckets,
                            config if buckets is not None else None)
