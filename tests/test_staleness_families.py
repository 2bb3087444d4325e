"""Staleness conformance for every fully supported family: a plan matches the batch as given, or the forward refuses it.

Each family's tiny model, its own processor-style batch of two rows (the second left-padded), and its plan either
carried in the batch (``prepare(batch)`` without a device, the batch then moved by the training loop) or prepared
(``prepare(batch, device, model)``), on the emulated CUDA device. Every control tensor of the batch is removed, set to
None, replaced or edited in place, before or after the move, and tensors the plan was built without are added. After
each edit the patched forward returns stock's logits on the edited batch (``torch.equal``), or it refuses with an error
that names the edited tensor (``StalePlan``, or the device-side assert of the checksum), or stock refuses the batch too.
Edits crafted to keep the old linear checksum ``sum(v_i * (i + 1))``, or a sum of whole values with odd weights (two
masked entries moved by 2**63), must be refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import syncfree
from family_checks import TINY, model_pair, tiny_family_params, two_rows, unit_of
from syncfree.audit import emulate_cuda
from syncfree.families import batch_to, processor_batch
from syncfree.inputs import Text
from syncfree.plan.active import StalePlan
from syncfree.plan.batch import PLAN_KEY, plan_inputs

DEVICE = "cuda"


# ---- edits --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Edit:
    """One change of a batch: ``name`` is the control tensor it touches, ``moved`` whether it happens after the move
    to the device, ``collision`` whether it keeps the linear checksum (then it must be refused)."""

    what: str
    name: str
    apply: Callable[[dict], dict]
    moved: bool = False
    collision: bool = False


def _popped(name):
    def apply(batch):
        batch.pop(name)
        return batch
    return apply


def _set(name, make):
    def apply(batch):
        batch[name] = make(batch)
        return batch
    return apply


def _in_place(name, change, through_data=False):
    def apply(batch):
        t = batch[name].data if through_data else batch[name]
        change(t)
        return batch
    return apply


def _flip_last(t: torch.Tensor) -> None:
    """One value changed: a 0/1 tensor's last value flipped, another tensor's last value plus one."""
    flat = t.view(-1)
    if t.dtype == torch.bool or bool(((t == 0) | (t == 1)).all()):
        flat[-1] = 1 - flat[-1] if t.dtype != torch.bool else ~flat[-1]
    else:
        flat[-1] += 1


def mask_collision(mask: torch.Tensor) -> tuple[int, int, int, int]:
    """Flat positions a, d of ones and b, c of zeros with a + d == b + c: turning the ones into zeros and the zeros
    into ones keeps ``sum(v_i * (i + 1))``. Rows keep a token each (the second row's first one stays)."""
    flat = mask.reshape(-1).tolist()
    ones = [i for i, v in enumerate(flat) if v == 1]
    zeros = [i for i, v in enumerate(flat) if v == 0]
    keep = {ones[0], min(i for i in ones if i >= mask.shape[1])}  # (each row's first token)
    candidates = set(ones) - keep
    for bi, b in enumerate(zeros):
        for c in zeros[bi + 1:]:
            for a in sorted(candidates):
                d = b + c - a
                if d > a and d in candidates:
                    return a, b, c, d
    raise AssertionError("no linear collision in this mask")


def _mask_collision(t: torch.Tensor) -> None:
    a, b, c, d = mask_collision(t)
    flat = t.view(-1)
    flat[[a, d]] = 0
    flat[[b, c]] = 1


def _ids_collision(t: torch.Tensor) -> None:
    """+1 at flat positions 0 and 3, -1 at 1 and 2 (0 + 3 == 1 + 2): the linear checksum stays."""
    flat = t.view(-1)
    flat[[0, 3]] += 1
    flat[[1, 2]] -= 1


def _mask_high_bit(t: torch.Tensor) -> None:
    """2**63 added to two masked entries: a sum of whole values weighted by odd numbers moves by 2**64 * odd, nothing
    modulo 2**64; stock's ``.bool()`` then attends where the plan masks."""
    masked = (t.reshape(-1) == 0).nonzero().flatten()[:2]
    t.view(-1)[masked] += -2**63


def _controls(batch: dict) -> list[str]:
    return [n for n in plan_inputs() if isinstance(batch.get(n), torch.Tensor)]


def _ints(batch: dict) -> list[str]:
    return [n for n in _controls(batch) if not batch[n].dtype.is_floating_point]


def _added(batch: dict) -> list[Edit]:
    rows, width = batch["input_ids"].shape
    return [Edit("position_ids added", "position_ids",
                 _set("position_ids", lambda b: torch.arange(width).expand(rows, width).clone())),
            Edit("cache_position added", "cache_position", _set("cache_position", lambda b: torch.arange(width)))]


def carried_edits(batch: dict) -> list[Edit]:
    """Edits of a carried batch: on the host before the loop moves it, and on the device after."""
    edits = [Edit(f"{n} removed", n, _popped(n)) for n in _controls(batch)]
    edits += [Edit(f"{n} set to None", n, _set(n, lambda b: None)) for n in ("attention_mask", "mm_token_type_ids")
              if n in batch]
    edits += [Edit("attention_mask replaced by ones", "attention_mask",
                   _set("attention_mask", lambda b: torch.ones_like(b["attention_mask"]))),
              Edit("input_ids replaced by an equal copy", "input_ids",
                   _set("input_ids", lambda b: b["input_ids"].clone())),
              Edit("attention_mask edited in place", "attention_mask", _in_place("attention_mask", _flip_last))]
    edits += _added(batch)
    edits += [Edit(f"{n} edited after the move", n, _in_place(n, _flip_last), moved=True) for n in _ints(batch)]
    edits += [Edit("attention_mask linear collision after the move", "attention_mask",
                   _in_place("attention_mask", _mask_collision), moved=True, collision=True),
              Edit("input_ids linear collision after the move", "input_ids", _in_place("input_ids", _ids_collision),
                   moved=True, collision=True),
              Edit("attention_mask moved by 2**63 after the move", "attention_mask",
                   _in_place("attention_mask", _mask_high_bit), moved=True, collision=True)]
    return edits


def prepared_edits(batch: dict) -> list[Edit]:
    """Edits of a prepared batch (its tensors on the device, its grids on the host), after ``prepare()``."""
    edits = [Edit(f"{n} removed", n, _popped(n)) for n in _controls(batch)]
    edits += [Edit("attention_mask set to None", "attention_mask", _set("attention_mask", lambda b: None)),
              Edit("attention_mask replaced by ones", "attention_mask",
                   _set("attention_mask", lambda b: torch.ones_like(b["attention_mask"]))),
              Edit("attention_mask replaced by an equal copy", "attention_mask",
                   _set("attention_mask", lambda b: b["attention_mask"].clone()))]
    edits += _added(batch)
    edits += [Edit(f"{n} edited in place", n, _in_place(n, _flip_last)) for n in _ints(batch)]
    edits += [Edit("attention_mask linear collision through .data", "attention_mask",
                   _in_place("attention_mask", _mask_collision, through_data=True), collision=True),
              Edit("input_ids linear collision through .data", "input_ids",
                   _in_place("input_ids", _ids_collision, through_data=True), collision=True),
              Edit("attention_mask moved by 2**63 through .data", "attention_mask",
                   _in_place("attention_mask", _mask_high_bit, through_data=True), collision=True)]
    return edits


# ---- outcomes -----------------------------------------------------------------------------------------------------
def _names(err: Exception, name: str) -> bool:
    """The refusal names the tensor: ``StalePlan`` (a ``ValueError``) or the checksum's device-side assert."""
    return isinstance(err, (ValueError, RuntimeError)) and re.search(rf"(?<!\w){name}(?!\w)", str(err)) is not None


def _logits(model, batch: dict):
    try:
        with torch.no_grad():
            return model(**batch).logits
    except Exception as err:  # noqa: BLE001 -- a refusal is an outcome here
        return err


def _check(stock, patched, edit: Edit, edited: dict, outputs=None) -> str | None:
    """None when the outcome is allowed, else what went wrong. ``outputs(model, batch)``: what is compared (the
    logits; the inner model's hidden states), or the exception raised."""
    outputs = outputs or _logits
    got = outputs(patched, edited)
    if isinstance(got, Exception) and _names(got, edit.name):
        return None
    if not isinstance(got, Exception) and edit.collision:
        return "accepted an edit that keeps the linear checksum"
    want = outputs(stock, batch_to({k: v for k, v in edited.items() if k != PLAN_KEY}, "cpu"))
    if isinstance(got, Exception):
        if isinstance(want, Exception) and type(want) is type(got):
            return None  # stock refuses the batch too
        return f"raised {type(got).__name__}: {str(got)[:200]} (stock: {type(want).__name__})"
    if isinstance(want, Exception):
        return f"gave outputs where stock raised {type(want).__name__}: {str(want)[:200]}"
    got = got.to("cpu")
    if not torch.equal(got, want):
        return f"outputs differ from stock by {(got - want).abs().max().item():.3g} without an error"
    return None


def _run(model_type: str, path: str) -> list[str]:
    preset = TINY[model_type]
    stock, patched = model_pair(preset)
    base = two_rows(stock.config, preset)
    failures = []
    with emulate_cuda():
        patched.to(DEVICE)
        try:
            for edit in (carried_edits if path == "carried" else prepared_edits)(base):
                batch = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in base.items()}
                if path == "carried":
                    carried = syncfree.prepare(batch, None, patched)
                    if edit.moved:
                        edited = edit.apply(batch_to(carried, DEVICE))
                    else:
                        edited = batch_to(edit.apply(carried), DEVICE)  # (the loop moves the batch as it finds it)
                else:
                    edited = edit.apply(syncfree.prepare(batch, DEVICE, patched))
                problem = _check(stock, patched, edit, edited)
                if problem is not None:
                    failures.append(f"{edit.what}: {problem}")
        finally:
            patched.to("cpu")
            if hasattr(getattr(patched, "model", None), "rope_deltas"):
                patched.model.rope_deltas = None  # (cached by the forward: an emulated tensor otherwise)
    return failures


@pytest.mark.parametrize("model_type", tiny_family_params())
def test_a_carried_plan_matches_the_batch_as_given_or_is_refused(model_type):
    failures = _run(model_type, "carried")
    assert not failures, f"{model_type}, carried plan:\n" + "\n".join(failures)


@pytest.mark.parametrize("model_type", tiny_family_params())
def test_a_prepared_plan_matches_the_batch_as_given_or_is_refused(model_type):
    failures = _run(model_type, "prepared")
    assert not failures, f"{model_type}, prepared plan:\n" + "\n".join(failures)


def test_the_crafted_mask_edit_keeps_the_linear_checksum():
    """The collisions above are collisions: the edited mask has the old checksum ``sum(v_i * (i + 1))``."""
    mask = torch.tensor([[1] * 9, [0] * 4 + [1] * 5])
    edited = mask.clone()
    _mask_collision(edited)
    weights = torch.arange(1, mask.numel() + 1)
    assert not torch.equal(edited, mask) and bool(edited.any(1).all())
    assert int((edited.reshape(-1) * weights).sum()) == int((mask.reshape(-1) * weights).sum())


def test_the_loop_preparing_a_carried_batch_without_its_mask_is_refused():
    """``prepare(carried, device)`` in the training loop, after the mask was dropped: refused there, by name."""
    stock, patched = model_pair("qwen3-vl-tiny")
    carried = syncfree.prepare(two_rows(stock.config, "qwen3-vl-tiny"), None, patched)
    carried.pop("attention_mask")
    with pytest.raises(StalePlan, match="attention_mask was removed"):
        syncfree.prepare(carried, "cpu", patched)


def test_generate_from_a_carried_batch_without_its_mask_is_refused():
    """``generate()`` makes a mask of its own when none is given: the plan's positions were made from the old one."""
    stock, patched = model_pair("qwen3-vl-tiny")
    carried = syncfree.prepare(two_rows(stock.config, "qwen3-vl-tiny"), None, patched)
    carried.pop("attention_mask")
    with torch.no_grad(), pytest.raises(StalePlan, match="attention_mask was removed"):
        patched.generate(**carried, max_new_tokens=2, do_sample=False)


# ---- the inner multimodal model, called directly ------------------------------------------------------------------
def _special_ids(config) -> set[int]:
    """Every id a config names (``*_token_id``, ``*_token_index``, in it and its sub-configs)."""
    found, todo = set(), [config]
    while todo:
        c = todo.pop()
        for key, value in vars(c).items():
            if hasattr(value, "to_dict") and hasattr(value, "model_type"):
                todo.append(value)
            elif isinstance(value, int) and (key.endswith("_token_id") or key.endswith("_token_index")):
                found.add(value)
            elif isinstance(value, (list, tuple)) and key.endswith("_token_id"):
                found.update(v for v in value if isinstance(v, int))
    return found


def distinct_prefix(batch: dict, config) -> dict:
    """The batch with its masked prefix holding distinct text ids instead of repeated pad ids (a repeated pad hides a
    position error: every masked row position then sees the same token)."""
    mask, ids = batch["attention_mask"], batch["input_ids"].clone()
    specials = _special_ids(config) | {int(i) for i in ids[mask == 0].unique()}
    free = [i for i in range(2, 2 + 4 * ids.shape[1]) if i not in specials]
    masked = (mask == 0).nonzero().tolist()
    for k, (r, c) in enumerate(masked):
        ids[r, c] = free[k]
    return {**batch, "input_ids": ids}


def inner_edits(batch: dict) -> list[Edit]:
    """Edits of a prepared batch handed to the inner ``*Model``: every control tensor removed or set to None, then the
    prepared path's others."""
    edits = [Edit(f"{n} set to None", n, _set(n, lambda b: None)) for n in _controls(batch)]
    return edits + prepared_edits(batch)


def _hidden(model, batch: dict):
    try:
        with torch.no_grad():
            return model.model(**batch).last_hidden_state
    except Exception as err:  # noqa: BLE001 -- a refusal is an outcome here
        return err


@pytest.mark.parametrize("model_type", tiny_family_params())
def test_the_inner_model_called_directly_matches_the_batch_as_given_or_is_refused(model_type):
    """``model.model(**prepare(batch, device, model))`` with a control tensor removed, set to None or edited: the
    inner multimodal model (as reward models and embedding extraction call it) checks the plan against every input its
    forward takes, present in the call or not."""
    preset = TINY[model_type]
    stock, patched = model_pair(preset)
    if not hasattr(getattr(getattr(patched, "model", None), "config", None), "vision_config"):
        pytest.skip(f"{model_type} has no inner multimodal model in this Transformers release")
    base = distinct_prefix(two_rows(stock.config, preset), stock.config)
    failures = []
    with emulate_cuda():
        patched.to(DEVICE)
        try:
            for edit in inner_edits(base):
                batch = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in base.items()}
                edited = edit.apply(syncfree.prepare(batch, DEVICE, patched))
                problem = _check(stock, patched, edit, edited, _hidden)
                if problem is not None:
                    failures.append(f"{edit.what}: {problem}")
        finally:
            patched.to("cpu")
            for m in (patched, getattr(patched, "model", None)):
                if hasattr(m, "rope_deltas"):
                    m.rope_deltas = None
    assert not failures, f"{model_type}, inner model:\n" + "\n".join(failures)


def test_the_inner_model_refuses_a_video_batch_without_its_seconds_per_grid():
    """Qwen2.5-VL's temporal positions come from ``second_per_grid_ts``: popped before ``model.model(...)``, stock
    computes them from the default, the plan from the batch's."""
    from syncfree.inputs import Video

    stock, patched = model_pair("qwen2.5-vl-tiny")
    u = unit_of(stock.config)
    batch = processor_batch(stock.config, [[Text(3), Video(4, 2 * u, 2 * u), Text(2)]])
    assert "second_per_grid_ts" in batch
    prepared = syncfree.prepare(batch, "cpu", patched)
    prepared.pop("second_per_grid_ts")
    with torch.no_grad(), pytest.raises(StalePlan, match="second_per_grid_ts"):
        patched.model(**prepared)
