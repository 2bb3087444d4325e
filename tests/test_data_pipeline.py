"""The plan built in DataLoader workers, carried with the batch, and taken by the patched model."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

import syncfree
from syncfree.audit import emulate_cuda
from syncfree.compare.train import labels_for
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.plan.batch import Plan
from syncfree.presets import PRESETS, build_model, load_config

PRESET = "qwen3-vl-tiny"
SAMPLES = [[[Text(3), Image(64, 64), Text(2)]], [[Text(4), Video(2, 64, 32), Text(1)]], [[Image(32, 32), Text(5)]],
           [[Text(7)]]]


class _Collate:
    """A collator as a user writes one: features are sample layouts, the batch is the processor's output."""

    def __init__(self):
        self.config = load_config(PRESET)

    def __call__(self, features):
        samples = [s for f in features for s in f]
        batch = build_inputs(self.config, samples, pad_token_id=PRESETS[PRESET].pad_token_id)
        batch["labels"] = labels_for(batch)
        return batch


def _loader(num_workers: int, collate) -> DataLoader:
    kwargs = {"multiprocessing_context": "spawn"} if num_workers else {}
    return DataLoader(SAMPLES, batch_size=2, collate_fn=collate, num_workers=num_workers, **kwargs)


def test_the_collator_pickles_and_adds_the_plan():
    collate = pickle.loads(pickle.dumps(syncfree.planning_collator(_Collate(), build_model(PRESET).config)))
    batch = collate(SAMPLES[:2])
    assert isinstance(batch["syncfree_plan"], Plan)
    assert batch["syncfree_plan"].batch_shape == tuple(batch["input_ids"].shape)


@pytest.mark.slow
def test_spawned_workers_plan_and_a_loop_moving_the_batch_trains_without_a_sync():
    model = build_model(PRESET, dtype=torch.float32, seed=0).train()
    loader = _loader(2, syncfree.planning_collator(_Collate(), model))
    batches = list(loader)  # built and planned in two spawned worker processes
    assert all(isinstance(b["syncfree_plan"], Plan) for b in batches)
    with emulate_cuda():
        model.to("cuda")
        syncfree.patch(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for batch in batches:
            # What HF Trainer does: every tensor to the device, everything else passed along.
            moved = {k: v.to("cuda", non_blocking=True) if isinstance(v, torch.Tensor) and not k.endswith("grid_thw")
                     else v for k, v in syncfree.prepare(batch, None).items()}
            plan = moved.pop("syncfree_plan").pin_memory()  # (what pin_memory=True does in the loader)
            with syncfree.assert_no_sync():
                model(**moved, syncfree_plan=plan).loss.backward()
                optimizer.step()
                optimizer.zero_grad()


def test_prepare_in_the_loop_after_the_workers_gives_the_same_loss_as_stock():
    model = build_model(PRESET, dtype=torch.float32, seed=0)
    stock_losses = [model(**b).loss for b in _loader(0, _Collate())]
    syncfree.patch(model)
    batches = list(_loader(0, syncfree.planning_collator(_Collate(), model)))
    losses = [model(**syncfree.prepare(b, "cpu")).loss for b in batches]
    assert all(torch.equal(a, b) for a, b in zip(stock_losses, losses))


@pytest.mark.parametrize("change", ["sliced", "packed", "edited"])
def test_a_batch_changed_after_its_plan_was_built_is_refused(change):
    batch = syncfree.planning_collator(_Collate())(SAMPLES[:2])
    if change == "sliced":
        batch = {k: v[:1] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v for k, v in batch.items()}
    elif change == "packed":
        keep = batch["attention_mask"].bool()
        batch = {k: v[keep][None] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v
                 for k, v in batch.items()}
    else:
        batch["input_ids"] = batch["input_ids"].clone()
        batch["input_ids"][0, -1] += 1
    with pytest.raises(ValueError, match="sliced, packed or edited after syncfree.prepare"):
        syncfree.prepare(batch, "cpu")
