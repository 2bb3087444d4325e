"""A prepared or carried plan never describes a batch it was not made from, and the registry of prepared
batches holds no batch alive: edits on the host that bump no version counter, carried plans edited in
place, inference tensors, and many prepare() calls."""

from __future__ import annotations

import gc

import pytest
import torch

import syncfree
from syncfree.audit import emulate_cuda
from syncfree.inputs import build_inputs, named_layout
from syncfree.plan import active
from syncfree.presets import build_model


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3-vl-tiny")


def _batch(model, seed: int = 0) -> dict:
    return build_inputs(model.config, named_layout("images", side=64), padding_side="left", seed=seed)


def _stock_logits(model, batch: dict) -> torch.Tensor:
    syncfree.unpatch(model)
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "syncfree_plan"}).logits


def _patched_logits(model, batch: dict) -> torch.Tensor:
    syncfree.patch(model)
    try:
        with torch.no_grad():
            return model(**batch).logits
    finally:
        syncfree.unpatch(model)


def _edits():
    """In-place edits that change what the forward computes: a mask hole, and an image placeholder turned
    into text, through the ways of writing that do and do not bump the version counter."""
    def hole(t):
        t[0, 6:10] = 0

    def numpy_hole(t):
        t.numpy()[0, 6:10] = 0

    def data_hole(t):
        t.data[0, 6:10] = 0

    return [("attention_mask", hole), ("attention_mask", numpy_hole), ("attention_mask", data_hole)]


@pytest.mark.parametrize("name,edit", _edits(), ids=["in-place", "numpy", "data"])
def test_a_carried_plan_refuses_a_batch_edited_on_the_host(model, name, edit):
    carried = syncfree.prepare(_batch(model), None, model)  # prepare(batch) in a DataLoader worker
    edit(carried[name])
    with pytest.raises(ValueError, match=name):
        _patched_logits(model, carried)
    with pytest.raises(ValueError, match=name):
        syncfree.prepare(carried, "cpu", model)  # and when the loop prepares it for the device


@pytest.mark.parametrize("name,edit", _edits(), ids=["in-place", "numpy", "data"])
def test_a_prepared_host_batch_edited_without_a_version_bump_is_refused(model, name, edit):
    prepared = syncfree.prepare(_batch(model), "cpu", model)
    edit(prepared[name])
    with pytest.raises(ValueError, match=f"{name} was modified in place"):
        _patched_logits(model, prepared)


def test_grids_kept_on_the_host_are_compared_by_value(model):
    prepared = syncfree.prepare(_batch(model), "cpu", model)
    grid = prepared["image_grid_thw"]
    grid.numpy()[[0, 1]] = grid.numpy()[[1, 0]]  # swap two images' grids behind the version counter
    with pytest.raises(ValueError, match="image_grid_thw was modified in place"):
        _patched_logits(model, prepared)


def test_an_unedited_carried_batch_still_equals_stock(model):
    batch = _batch(model)
    carried = syncfree.prepare(batch, None, model)
    assert torch.equal(_patched_logits(model, carried), _stock_logits(model, batch))


def test_a_batch_made_in_inference_mode_is_prepared_and_equals_stock(model):
    with torch.inference_mode():
        batch = _batch(model)
    prepared = syncfree.prepare(batch, "cpu", model)
    assert torch.equal(_patched_logits(model, prepared), _stock_logits(model, batch))
    with torch.inference_mode():
        prepared["attention_mask"][0, 6:10] = 0  # inference tensors keep no version counter
    with pytest.raises(ValueError, match="attention_mask was modified in place"):
        _patched_logits(model, prepared)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_registry_keeps_no_batch_alive(model, device):
    batch = _batch(model)
    gc.collect()
    before = len(active._registry)
    with emulate_cuda() if device == "cuda" else torch.no_grad():
        for _ in range(300 if device == "cpu" else 60):
            syncfree.prepare({k: v.clone() for k, v in batch.items()}, device, model)
        gc.collect()
        assert len(active._registry) == before


def _rows_twice(batch: dict) -> dict:
    """The batch concatenated with itself (not each row repeated, as generate() expands a batch)."""
    doubled = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")
    return {k: torch.cat([v, v]) if k in doubled else v for k, v in batch.items()}


def _repad_right(batch: dict) -> dict:
    """The same items padded on the right instead of the left (same shapes, other positions)."""
    ids, mask, types = batch["input_ids"].clone(), batch["attention_mask"].clone(), batch["mm_token_type_ids"].clone()
    for r in range(ids.shape[0]):
        n = int(mask[r].sum())
        for t in (ids, mask, types):
            t[r] = torch.cat([t[r][-n:], t[r][:-n]]) if n < t.shape[1] else t[r]
    return {**batch, "input_ids": ids, "attention_mask": mask, "mm_token_type_ids": types}


def _two_rows(model) -> dict:
    return build_inputs(model.config, named_layout("mixed", side=64), padding_side="left")


@pytest.mark.parametrize("change", ["hole", "replaced", "repadded", "concatenated"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_carried_plan_refuses_a_changed_batch_after_the_move(model, change, device):
    """The training loop moves a batch that carries its plan (HF Trainer does): on the device the check runs
    there (a device-side assert on a GPU; at once on the emulated device); on the host by value."""
    from syncfree.inputs import batch_to

    batch = _two_rows(model)
    carried = syncfree.prepare(batch, None, model)
    if change == "hole":
        carried = {**carried, "attention_mask": carried["attention_mask"].clone()}
        carried["attention_mask"][1, -4:] = 0
    elif change == "replaced":
        carried = {**carried, **{k: carried[k].flip(1) for k in ("input_ids", "mm_token_type_ids")}}
    elif change == "repadded":
        carried = _repad_right(carried)
    else:
        carried = _rows_twice(carried)
    syncfree.patch(model)
    try:
        with emulate_cuda():
            model.to(device)
            try:
                # (Every shape is checked before any checksum: a tensor left at its old shape is named at once, on a
                # GPU too, where a checksum's assert would come later.)
                with torch.no_grad(), pytest.raises((ValueError, RuntimeError),
                                                    match="differs from the batch|its syncfree plan was built for"):
                    model(**batch_to(carried, device))
            finally:
                model.to("cpu")
    finally:
        syncfree.unpatch(model)


def test_a_prepared_device_batch_edited_through_data_is_refused_without_a_sync(model):
    syncfree.patch(model)
    try:
        with emulate_cuda():
            model.to("cuda")
            try:
                prepared = syncfree.prepare(_two_rows(model), "cuda", model)
                with syncfree.audit() as report, torch.no_grad():
                    model(**prepared)
                assert report.syncs == [] and not any(c.blocking for c in report.copies)
                prepared["attention_mask"].data[1, -4:] = 0  # bumps no version counter
                with torch.no_grad(), pytest.raises(RuntimeError, match="attention_mask differs"):
                    model(**prepared)
            finally:
                model.to("cpu")
    finally:
        syncfree.unpatch(model)
