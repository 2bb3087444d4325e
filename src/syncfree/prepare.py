"""``prepare``: processor output on the host -> validated plan -> model kwargs on the device, without a sync."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .plan import active
from .plan.batch import PLAN_KEY, Plan, draft_plan, finish_plan, plan_inputs
from .plan.dynamic_dims import mark_layout_dims
from .plan.packing import Packing
from .plan.spec import ModelSpec, assumed_spec, multimodal_config
from .plan.validate import check_batch, check_inputs

__all__ = ["prepare", "plan_of", "plan_batch", "model_spec"]

_PIXELS = ("pixel_values", "pixel_values_videos", "input_features")
# Grids stay on the host: the patched forward reads them only there (and stock code that still
# looks at them, e.g. generate()'s bookkeeping, then reads host memory instead of the device). A family's own
# such inputs: ``PlanHooks.host_only``.
_HOST_ONLY = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts", "video_second_per_grid")


def _ids_from_types(spec: ModelSpec, batch: Mapping) -> ModelSpec:
    """Without a model: take the placeholder token ids from mm_token_type_ids where it marks them."""
    ids, types = batch.get("input_ids"), batch.get("mm_token_type_ids")
    if not (isinstance(ids, torch.Tensor) and isinstance(types, torch.Tensor) and ids.shape == types.shape):
        return spec
    found = {}
    for kind, field in ((1, "image_token_id"), (2, "video_token_id")):
        values = ids[types == kind].unique()
        if values.numel() == 1:
            found[field] = int(values)
    import dataclasses

    return dataclasses.replace(spec, **found)


def model_spec(model, batch: Mapping) -> ModelSpec:
    """The ``ModelSpec`` a plan of ``batch`` is made from: ``model``'s (a model, its config, or a spec itself), or
    without a model the one assumed, with the placeholder ids the batch's token types show."""
    if model is None:
        if not isinstance(batch.get("mm_token_type_ids"), torch.Tensor) and any(
                isinstance(batch.get(n), torch.Tensor) for n in (*_PIXELS, "image_grid_thw", "video_grid_thw")):
            # Nothing in the batch says which tokens are placeholders: the assumed family's ids would be a guess
            # (another family's batch would then count no placeholders at all).
            raise ValueError("syncfree.prepare(batch) without a model reads the placeholder token ids from "
                             "mm_token_type_ids, and this batch has none; pass the model (or its config): "
                             "syncfree.prepare(batch, device, model)")
        return _ids_from_types(_assumed_spec(), batch)
    if isinstance(model, ModelSpec):
        return model
    return ModelSpec.from_config(multimodal_config(model))


def _assumed_spec() -> ModelSpec:
    """The spec assumed without a model: the published values one family group declares (``ASSUMED_SPEC``), which
    the registry registers when it is imported."""
    from . import families  # noqa: F401  (the registry)

    spec = assumed_spec()
    if spec is None:
        raise ValueError("syncfree.prepare(batch) without a model: no family declares the values to assume; pass the "
                         "model (or its config): syncfree.prepare(batch, device, model)")
    return spec


def prepare(batch: Mapping, device: str | torch.device | None = None, model=None, *, buckets=None) -> dict:
    """Validate a processor batch, plan the forward on the host, and move it to ``device``.

    ``batch`` is the processor's output (a ``BatchFeature`` or a dict) with tensors on the CPU.
    ``model`` (or its config) supplies the merge size and token ids; without it the published
    values of the family syncfree assumes are used (see the usage guide; placeholder ids are read
    from ``mm_token_type_ids`` when present), and the forward checks them against the model.

    With a ``device``, returns exactly the keyword arguments of ``model(**kwargs)`` and
    ``model.generate(**kwargs)``, device tensors moved with pinned, non-blocking copies (grids stay
    on the host). The plan is kept beside them, keyed by the returned tensor objects: replacing or
    editing one of them afterwards makes the patched forward refuse the stale plan.

    With ``device=None`` nothing is moved and the plan is added under the key ``"syncfree_plan"``:
    that is what a ``DataLoader`` worker should do (no CUDA there, and the dict pickles); call
    ``prepare(result, device)`` in the main process to move it.

    ``buckets`` (a ``syncfree.Buckets``, with ``model``): first pad the batch up to the smallest bucket that holds it,
    so that a stream of layouts makes a few static shapes (CUDA graphs); see ``syncfree.buckets``.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"syncfree.prepare takes the processor's output (a BatchFeature or a dict of tensors), got "
                        f"{type(batch).__name__}")
    target = _target(device)
    batch = dict(batch)
    if buckets is not None:
        batch = _bucketed(batch, buckets, model)
    plan: Plan | None = batch.pop(PLAN_KEY, None)
    carried = plan is not None  # (a collator's plan; else one made here, whose packing the positions say)
    if plan is None:
        plan = plan_batch(batch, model_spec(model, batch), ids_assumed=model is None)
    else:
        if not isinstance(plan, Plan):
            raise ValueError(f"batch[{PLAN_KEY!r}] must be the plan syncfree.prepare() added, got {type(plan).__name__}")
        plan.check_batch(batch)
        if model is not None:
            plan.check_model(model_spec(model, batch))
    if plan.packing is not None and model is not None:
        from .patching import packing_refusal  # (the patching side: whether this model keeps packed samples apart)

        refusal = packing_refusal(model, collated=carried)
        if refusal is not None:
            raise ValueError(refusal)
    if device is None:
        return {**batch, PLAN_KEY: plan}
    moved, host_only = {}, _HOST_ONLY + plan.spec.hooks.host_only
    for name, value in batch.items():
        if (isinstance(value, torch.Tensor) and name not in host_only and value.device.type == "cpu"
                and target.type != "cpu"):
            value = value.pin_memory().to(target, non_blocking=True)
        elif type(value) is torch.Tensor and value.dim() > 0 and not value.requires_grad:
            # (an alias of the same memory and version counter, not a view: Dynamo's marks below go on it, never on
            # the caller's tensor, and Dynamo takes it as an input of its own, not as a view of an unmarked base)
            value = value.detach()
        moved[name] = value
    placed = plan.to(target) if plan.device != str(target) else plan
    active.register(placed, moved)
    mark_layout_dims(moved, placed)  # (for torch.compile: which sizes follow the layout)
    return moved


def _bucketed(batch: dict, buckets, model) -> dict:
    from .buckets import bucket_batch
    from .families import processor_batch  # (the family's layout of a filler image)

    config = multimodal_config(model)
    if config is None:
        raise ValueError("syncfree.prepare(batch, device, model, buckets=...) needs the model (or its config): its "
                         "processor's layout of an image")
    plan = batch.pop(PLAN_KEY, None)
    if isinstance(plan, Plan) and plan.packing is not None:
        raise ValueError("syncfree buckets pad padded batches; this one is packed (syncfree.packing_collator): its "
                         "rows already hold samples end to end, and buckets do not take packed rows yet")
    padded = bucket_batch(batch, buckets, config, processor_batch)
    if plan is None:
        return padded
    if any(padded[n] is not batch[n] for n in batch if n in padded):
        raise ValueError("this batch was planned before it was bucketed; give the buckets to "
                         "syncfree.planning_collator(..., buckets=...) (or to prepare in the worker)")
    return {**padded, PLAN_KEY: plan}


def plan_batch(batch: Mapping, spec: ModelSpec, *, ids_assumed: bool = False, packing: Packing | None = None) -> Plan:
    """The plan of a processor batch of host tensors, its inputs checked first (``ValueError`` naming the first
    inconsistency). ``packing``: the segments of a padding-free packed batch (``syncfree.packing_collator``)."""
    checked = plan_inputs() + _PIXELS
    for name in checked:
        value = batch.get(name)
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            raise ValueError(f"syncfree.prepare expects the processor's CPU tensors, but {name} is on "
                             f"{value.device}; call prepare() before moving the batch (or just call the patched "
                             "model: it reads the control tensors once)")
    given = {k: batch.get(k) for k in checked}
    check_inputs(spec, **given, ids_assumed=ids_assumed)
    draft = draft_plan(spec, **{k: batch.get(k) for k in plan_inputs()})  # every piece made once
    check_batch(draft, **given)
    # A family with an audio encoder whose index stock computes (``rope_class``): the batch may carry the forward's
    # use_audio_in_video flag; positions are made for it.
    return finish_plan(draft, bool(batch.get("use_audio_in_video")) and spec.rope.audio_class is not None, packing)


def _target(device) -> torch.device | None:
    """The device to move the batch to, checked before any work: a CUDA device needs CUDA, real or emulated."""
    if device is None:
        return None
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"syncfree.prepare(batch, {str(device)!r}): this machine has no CUDA device; run it "
                           "inside syncfree.emulate_cuda() to audit on an emulated one, or prepare for \"cpu\"")
    return target


def plan_of(kwargs: Mapping) -> Plan | None:
    """The plan ``prepare`` made for ``kwargs`` (its ``"syncfree_plan"`` entry, or the one kept beside it)."""
    plan = kwargs.get(PLAN_KEY)
    if plan is not None:
        return plan
    anchor = kwargs.get("input_ids")
    found = active.registered(anchor if anchor is not None else kwargs.get("mm_token_type_ids"))
    return found.plan if found is not None else None
