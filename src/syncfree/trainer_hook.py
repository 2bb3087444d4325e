"""``planning_trainer``: plan every processor batch a Hugging Face ``Trainer`` (or a TRL trainer) moves to the device.

``Trainer`` moves each batch with one method, ``_prepare_input``; TRL's trainers move the batches they build
themselves through it too (``GRPOTrainer`` its generation batch and the processor's output for the loss batch).
The subclass ``planning_trainer`` returns plans each such batch on the host before it is moved, exactly as
``syncfree.prepare(batch, device, model)`` does: the tensors go to the device with pinned, non-blocking copies,
the grids stay on the host, and the patched model finds the plan by the tensors it is given. Nothing else of the
trainer changes. (A batch the patched model cannot be planned for is refused by ``prepare`` with its one-line
error, as the forward would refuse it; with DeepSpeed, which casts inputs on the way, batches are moved as before.)

A trainer that builds its loss batches from its rollouts (TRL's ``GRPOTrainer``) moves those
itself, not through ``_prepare_input``: for it the subclass also keeps host copies of each loss batch and plans the
loss forward from them (``trainer_rollouts``).

Use ``planning_collator`` where the trainer takes a data collator (the plan is then made in the ``DataLoader``
workers); use ``planning_trainer`` where batches are built inside the trainer (GRPO's rollouts).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from .patching import is_patched
from .prepare import prepare
from .trainer_rollouts import has_rollouts, rollout_overrides

__all__ = ["planning_trainer"]

_GRIDS = ("image_grid_thw", "video_grid_thw")


_MULTIMODAL = ("syncfree_plan", "mm_token_type_ids", "pixel_values", "pixel_values_videos", *_GRIDS)


def _plannable(data: Mapping) -> bool:
    """A multimodal processor batch on the host: 2D ``input_ids``, with a plan, token types, pixels or grids (a text
    tokenizer's batch, e.g. a reward model's, is left to the trainer)."""
    ids = data.get("input_ids")
    return (isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.device.type == "cpu"
            and any(data.get(name) is not None for name in _MULTIMODAL)
            and all(not isinstance(data.get(g), torch.Tensor) or data[g].device.type == "cpu" for g in _GRIDS))


@functools.lru_cache(maxsize=None)
def planning_trainer(trainer_class: type) -> type:
    """A subclass of ``trainer_class`` (``transformers.Trainer`` or a subclass, e.g. TRL's ``SFTTrainer`` or
    ``GRPOTrainer``) that plans each processor batch it moves to the device (``syncfree.prepare``), when its model
    is patched. Constructed and used exactly as ``trainer_class``::

        trainer = syncfree.planning_trainer(GRPOTrainer)(model=syncfree.patch(model), ...)
    """
    if not isinstance(trainer_class, type) or not callable(getattr(trainer_class, "_prepare_input", None)):
        raise TypeError(f"planning_trainer() takes a Trainer class (one that moves batches with _prepare_input), got "
                        f"{trainer_class!r}")
    stock = trainer_class._prepare_input

    def _prepare_input(self, data):
        # (With DeepSpeed, Trainer also casts float inputs to its dtype on the way: that batch is left to it.)
        if (isinstance(data, Mapping) and _plannable(data) and is_patched(self.model)
                and not getattr(self, "is_deepspeed_enabled", False)):
            planned = prepare(data, self.args.device, self.model)
            # Nested values (none in a processor batch) are moved as Trainer moves them.
            planned = {k: stock(self, v) if isinstance(v, (Mapping, list, tuple)) else v for k, v in planned.items()}
            try:
                return type(data)(planned)  # (a BatchFeature stays one)
            except TypeError:
                return planned
        return stock(self, data)

    _prepare_input.__doc__ = stock.__doc__
    methods = {"_prepare_input": _prepare_input}
    if has_rollouts(trainer_class):  # (TRL's GRPO trainer: its loss batches, see trainer_rollouts)
        methods.update(rollout_overrides(trainer_class))
    return type(f"Planning{trainer_class.__name__}", (trainer_class,),
                {**methods, "__module__": __name__,
                 "__doc__": f"{trainer_class.__name__} that plans each processor batch it moves (syncfree)."})
