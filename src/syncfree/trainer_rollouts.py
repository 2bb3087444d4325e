"""The loss batches of TRL's rollout trainers (``GRPOTrainer``): host copies, and the plan made from them.

(TRL's ``RLOOTrainer`` has the same methods and gets the same overrides; it is untested: a layout of its own that
the copies do not reproduce falls back to the one read where the shapes differ, and is refused where only values do.)

These trainers build each loss batch themselves: the prompts' token ids and the completions (host lists, once the
rollout is read back) are padded, moved to the device with ``.to(device)``, shuffled and split into micro-batches,
and ``compute_loss`` concatenates prompts and completions on the device before the forward. No tensor of that batch
ever passes the host again, so the patched model would read the control tensors once per loss forward.

``planning_trainer`` adds three thin overrides to such a trainer:

* ``_generate`` keeps the host lists the rollout returns (prompt ids, completion ids);
* ``_generate_and_score_completions`` lays them out as the trainer lays out its batch (the trainer's own ``pad``,
  padding side, ``pad_to_multiple_of`` and truncated-completion masking) and adds the host copies to the batch, as
  CPU tensors (``syncfree_input_ids``, ``syncfree_attention_mask``, ``syncfree_mm_token_type_ids``): the trainer
  shuffles and splits them with every other tensor of the batch;
* ``compute_loss`` plans each micro-batch from its host copies and the host grids, and the loss forward takes that
  plan (``plan.active.expect``), checked against the tensors it is given on the device, without a wait: a layout of
  the trainer's that the copies did not reproduce is refused with syncfree's message, never planned wrongly.

Where the copies cannot be made (a trainer without these methods, shapes that do not match the batch's), the batch
goes on without them and the forward reads its control tensors once, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .patching import is_patched
from .plan import active
from .prepare import model_spec, prepare

__all__ = ["HOST_PREFIX", "rollout_overrides", "has_rollouts"]

HOST_PREFIX = "syncfree_"
# What a trainer that lays its batch out otherwise (other attributes, another rollout tuple) raises here.
_LAYOUT_CHANGED = (AttributeError, ImportError, IndexError, KeyError, TypeError, ValueError)
_STOCK_TYPES = {"image_token_id": 1, "video_token_id": 2}  # the processors' mm_token_type_ids, by token id


def has_rollouts(trainer_class: type) -> bool:
    """Whether ``trainer_class`` builds its loss batches from its rollouts as TRL's GRPO trainer does."""
    return all(callable(getattr(trainer_class, n, None))
               for n in ("_generate", "_generate_and_score_completions", "compute_loss"))


def _token_types(spec, ids: torch.Tensor) -> torch.Tensor:
    types = torch.zeros_like(ids)
    for field, kind in _STOCK_TYPES.items():
        token = getattr(spec, field, None)
        if token is not None:
            types[ids == token] = kind
    return types


def _host_copies(trainer, lists, batch: Mapping) -> dict | None:
    """The batch's ``input_ids``, ``attention_mask`` and ``mm_token_type_ids`` as the loss forward will be given them
    (prompts then completions), built on the host from the rollout's lists; None where they do not fit the batch."""
    from trl.trainer.utils import pad  # the trainer's own padding

    prompts, completions = lists
    pad_id, multiple = trainer._tokenizer.pad_token_id, getattr(trainer, "pad_to_multiple_of", None)
    prompts = [torch.tensor(ids) for ids in prompts]
    completions_t = [torch.tensor(ids) for ids in completions]
    prompt_ids = pad(prompts, padding_value=pad_id, padding_side="left", pad_to_multiple_of=multiple)
    prompt_mask = pad([torch.ones_like(t, dtype=torch.long) for t in prompts], padding_value=0, padding_side="left",
                      pad_to_multiple_of=multiple)
    completion_ids = pad(completions_t, padding_value=pad_id, padding_side="right", pad_to_multiple_of=multiple)
    completion_mask = pad([torch.ones_like(t, dtype=torch.long) for t in completions_t], padding_value=0,
                          padding_side="right", pad_to_multiple_of=multiple)
    if getattr(trainer, "mask_truncated_completions", False):
        ends = [*trainer.eos_token_ids, pad_id]
        truncated = torch.tensor([ids[-1] not in ends for ids in completions])
        completion_mask = completion_mask * (~truncated).unsqueeze(1).int()
    if (tuple(prompt_ids.shape) != tuple(batch["prompt_ids"].shape)
            or tuple(completion_ids.shape) != tuple(batch["completion_ids"].shape)):
        return None
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    copies = {"input_ids": input_ids, "attention_mask": torch.cat([prompt_mask, completion_mask], dim=1)}
    given_types = batch.get("mm_token_type_ids")
    if isinstance(given_types, torch.Tensor):
        types = torch.cat([_token_types(model_spec(trainer.model, {}), prompt_ids), torch.zeros_like(completion_ids)], 1)
        if tuple(types.shape) != tuple(given_types.shape):
            return None
        copies["mm_token_type_ids"] = types
    return {HOST_PREFIX + name: value for name, value in copies.items()}


def _plan_of(trainer, inputs: Mapping):
    """The plan of a micro-batch, from its host copies and its grids (on the host, as planning_trainer left them)."""
    batch = {name[len(HOST_PREFIX):]: value for name, value in inputs.items()
             if name.startswith(HOST_PREFIX) and isinstance(value, torch.Tensor)}
    if "input_ids" not in batch:
        return None
    for name in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts"):
        value = inputs.get(name)
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                return None  # (moved by the trainer: the forward reads, as before)
            batch[name] = value
    return prepare(batch, None, trainer.model)["syncfree_plan"]


def rollout_overrides(trainer_class: type) -> dict:
    """``_generate``, ``_generate_and_score_completions`` and ``compute_loss`` for a subclass of ``trainer_class``."""
    stock_generate = trainer_class._generate
    stock_score = trainer_class._generate_and_score_completions
    stock_loss = trainer_class.compute_loss

    def _generate(self, *args, **kwargs):
        out = stock_generate(self, *args, **kwargs)
        self._syncfree_rollout = (out[0], out[1])  # (prompt ids, completion ids: host lists)
        return out

    def _generate_and_score_completions(self, *args, **kwargs):
        self._syncfree_rollout = None
        batch = stock_score(self, *args, **kwargs)
        lists, self._syncfree_rollout = self._syncfree_rollout, None
        if lists is not None and is_patched(self.model) and isinstance(batch, dict):
            try:
                copies = _host_copies(self, lists, batch)
            except _LAYOUT_CHANGED:  # (a TRL release laid out otherwise: the forward reads, as without copies)
                copies = None
            if copies is not None:
                batch.update(copies)
        return batch

    def compute_loss(self, model, inputs, *args, **kwargs):
        try:
            plan = _plan_of(self, inputs) if is_patched(self.model) else None
        except ValueError:  # copies the plan's checks refuse: the forward reads the batch itself (and refuses it
            plan = None     # with stock's error if the batch itself is wrong)
        if plan is None:
            return stock_loss(self, model, inputs, *args, **kwargs)
        with active.expect(plan):
            return stock_loss(self, model, inputs, *args, **kwargs)

    for override, stock in ((_generate, stock_generate), (_generate_and_score_completions, stock_score),
                            (compute_loss, stock_loss)):
        override.__doc__ = stock.__doc__
    return {"_generate": _generate, "_generate_and_score_completions": _generate_and_score_completions,
            "compute_loss": compute_loss}
