"""TRL's trainers on a patched model (examples/train_with_trl_sft.py, examples/train_with_trl_grpo.py), and
``syncfree.planning_trainer``, which plans the batches a trainer moves to the device itself."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import BatchFeature

import syncfree
from client_examples import load_example
from syncfree.inputs import build_inputs, named_layout
from syncfree.prepare import plan_of
from syncfree.presets import build_model


class _Mover:
    """What planning_trainer relies on in a Trainer: ``model``, ``args.device`` and ``_prepare_input``."""

    def __init__(self, model, device="cpu"):
        self.model, self.args = model, types.SimpleNamespace(device=torch.device(device))

    def _prepare_input(self, data):
        return ("stock", data)


@pytest.fixture(scope="module")
def patched():
    return syncfree.patch(build_model("qwen3-vl-tiny"))


def test_planning_trainer_plans_each_processor_batch_it_moves(patched):
    batch = BatchFeature(build_inputs(patched.config, named_layout("mixed", 64)))
    trainer = syncfree.planning_trainer(_Mover)(patched)
    moved = trainer._prepare_input(batch)
    assert isinstance(moved, BatchFeature) and moved.keys() == batch.keys()
    assert plan_of(moved) is not None  # registered for the tensors handed out
    assert all(torch.equal(moved[k], batch[k]) for k in batch)


def test_planning_trainer_moves_a_batch_planned_in_the_collator_with_its_plan(patched):
    batch = syncfree.prepare(build_inputs(patched.config, named_layout("mixed", 64)), None, patched)  # (the collator)
    moved = syncfree.planning_trainer(_Mover)(patched)._prepare_input(batch)
    assert "syncfree_plan" not in moved and plan_of(moved) is batch["syncfree_plan"]


def test_planning_trainer_leaves_other_data_and_unpatched_models_to_the_trainer(patched):
    batch = build_inputs(patched.config, named_layout("image", 64))
    trainer = syncfree.planning_trainer(_Mover)(patched)
    tensor = torch.ones(2)
    assert trainer._prepare_input(tensor) == ("stock", tensor)
    on_device = {**batch, "input_ids": batch["input_ids"].to("meta")}
    assert trainer._prepare_input(on_device)[0] == "stock"  # already moved: nothing to plan from
    text = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    assert trainer._prepare_input(text)[0] == "stock"  # a text tokenizer's batch (a reward model's)
    assert syncfree.planning_trainer(_Mover)(build_model("qwen3-vl-tiny"))._prepare_input(batch)[0] == "stock"
    assert syncfree.planning_trainer(_Mover) is syncfree.planning_trainer(_Mover)  # one subclass per class
    with pytest.raises(TypeError, match="planning_trainer\\(\\) takes a Trainer class"):
        syncfree.planning_trainer(trainer)


def test_a_batch_the_planning_trainer_moved_runs_without_a_sync(patched):
    batch = build_inputs(patched.config, named_layout("mixed", 64))
    with torch.no_grad():
        expected = patched(**batch).logits
    with torch.no_grad(), syncfree.emulate_cuda():
        patched.to("cuda")
        try:
            moved = syncfree.planning_trainer(_Mover)(patched, "cuda")._prepare_input(batch)
            assert moved["image_grid_thw"].device.type == "cpu" and moved["input_ids"].device.type == "cuda"
            with syncfree.assert_no_sync():
                logits = patched(**moved).logits
            assert torch.equal(logits.to("cpu"), expected)
        finally:
            patched.to("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_sft_patched_losses_equal_stock_and_only_trl_and_trainer_sync(preset):
    pytest.importorskip("trl")
    example = load_example("train_with_trl_sft")
    stock = example.train(preset, patched=False, steps=2, verbose=False)
    patched = example.train(preset, patched=True, steps=2, verbose=False)
    assert len(stock["losses"]) == len(patched["losses"]) == 2
    assert all(torch.equal(a, b) for a, b in zip(stock["losses"], patched["losses"]))
    assert any(s["owners"].get("model", 0) for s in stock["steps"])  # stock's forward syncs, so the audit sees
    for step in patched["steps"]:
        assert set(step["owners"]) <= {"trl", "trainer"}, step["lines"]  # none of the model's, none of syncfree's
        trl = [line for line in step["lines"] if line.startswith("trl/")]
        assert trl and all("(compute_loss)" in line for line in trl)  # TRL's metrics: entropy, accuracy, tokens


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_grpo_patched_completions_and_training_equal_stock_without_a_read_of_syncfree(preset):
    pytest.importorskip("trl")
    example = load_example("train_with_trl_grpo")
    stock = example.train(preset, patched=False, steps=1, verbose=False)
    patched = example.train(preset, patched=True, steps=1, verbose=False)
    assert all(torch.equal(a, b) for a, b in zip(stock["completions"], patched["completions"]))
    assert all(torch.equal(a, b) for a, b in zip(stock["losses"], patched["losses"]))
    assert all(torch.equal(w, patched["weights"][n]) for n, w in stock["weights"].items())
    (step,) = patched["steps"]
    # Generation batch planned where the trainer moves it, the loss batch from its host copies: no read of
    # syncfree's, none of the model's; what is left is the generation loop's, TRL's and Trainer's.
    assert set(step["owners"]) <= {"generate", "trl", "trainer"}, step["lines"]
    assert step["owners"]["trl"] < stock["steps"][0]["owners"]["trl"]  # TRL's grid reads are host reads now


@pytest.mark.slow
def test_grpo_loss_batches_with_truncated_completions_masked_are_planned_too():
    pytest.importorskip("trl")
    example = load_example("train_with_trl_grpo")
    # 4 new tokens, no end-of-sequence token: every completion is truncated, and masked out of the attention.
    patched = example.train("qwen3-vl-tiny", patched=True, steps=1, verbose=False, mask_truncated_completions=True)
    (step,) = patched["steps"]
    assert "syncfree" not in step["owners"] and "model" not in step["owners"], step["lines"]


def test_an_expected_plan_is_taken_only_by_its_own_batch(patched):
    from syncfree.plan import active

    batch = build_inputs(patched.config, named_layout("mixed", 64))
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
    other = dict(batch, input_ids=batch["input_ids"].flip(1))  # the same shape, other tokens
    with torch.no_grad(), syncfree.emulate_cuda():
        patched.to("cuda")
        try:
            moved = {k: v if "grid" in k else v.to("cuda") for k, v in batch.items()}
            with active.expect(plan), syncfree.assert_no_sync():
                patched(**moved)
            wrong = {k: v if "grid" in k else v.to("cuda") for k, v in other.items()}
            with active.expect(plan), pytest.raises(RuntimeError, match="input_ids differs from the batch its plan"):
                patched(**wrong)
            narrower = {k: v[:, 1:] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v
                        for k, v in moved.items()}
            with active.expect(plan), syncfree.audit() as report:  # another shape: not taken (read, planned anew)
                patched(**narrower)
            assert [e.line.split(":")[0] for e in report.syncs] == ["syncfree/rewrite/host_read.py"]
        finally:
            patched.to("cpu")
