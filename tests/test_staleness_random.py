"""500 random edits of prepared and carried batches: each forward either equals stock on the edited batch
(``torch.equal``) or is refused with an error — never a different number without one.

Edits: one value of ``input_ids`` or ``attention_mask`` changed in place, through ``.numpy()`` or ``.data``
(which bump no version counter) or in a replacing tensor; the tokens sliced, rolled (re-padded) or the
whole batch concatenated with itself. Batches: prepared for the host or the (emulated) device, or
carrying their plan (``prepare(batch)``) and moved to the device before or after the edit.
"""

from __future__ import annotations

import random

import pytest
import torch

import syncfree
from syncfree.audit import emulate_cuda
from syncfree.inputs import batch_to, build_inputs, named_layout
from syncfree.presets import build_model

TOKENS = ("input_ids", "attention_mask", "mm_token_type_ids")
VISION = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
EDITS = ("inplace", "numpy", "data", "replace", "slice", "concat", "repad")
BATCHES = ("prepared-cpu", "carried-cpu", "carried-moved-after-edit", "carried-edited-after-move", "prepared-cuda")


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3-vl-tiny")


def _edit(rng: random.Random, batch: dict, how: str) -> dict:
    row, col = rng.randrange(batch["input_ids"].shape[0]), rng.randrange(batch["input_ids"].shape[1])
    name = rng.choice(["attention_mask", "input_ids"])
    value = 0 if name == "attention_mask" else rng.randrange(10, 900)
    if how == "inplace":
        batch[name][row, col] = value
    elif how == "numpy":
        batch[name].numpy()[row, col] = value
    elif how == "data":
        batch[name].data[row, col] = value
    elif how == "replace":
        batch[name] = batch[name].clone()
        batch[name][row, col] = value
    elif how == "slice":
        batch.update({k: batch[k][:, 1:] for k in TOKENS})
    elif how == "concat":
        batch.update({k: torch.cat([batch[k], batch[k]]) for k in TOKENS + VISION if k in batch})
    else:  # re-padded: the same tokens one position later
        batch.update({k: batch[k].roll(1, dims=1) for k in TOKENS})
    return batch


def _forward(model, batch: dict, patched: bool):
    (syncfree.patch if patched else syncfree.unpatch)(model)
    try:
        with torch.no_grad():
            return model(**batch).logits.to("cpu")
    except Exception as err:  # noqa: BLE001 -- a refusal is an outcome here
        return err
    finally:
        syncfree.unpatch(model)


def _one(model, base: dict, rng: random.Random) -> str:
    how, kind = rng.choice(EDITS), rng.choice(BATCHES)
    batch = {k: v.clone() for k, v in base.items()}
    device = "cpu" if kind in ("prepared-cpu", "carried-cpu") else "cuda"
    with emulate_cuda():
        if kind == "prepared-cpu":
            batch = _edit(rng, syncfree.prepare(batch, "cpu", model), how)
        elif kind == "carried-cpu":
            batch = _edit(rng, syncfree.prepare(batch, None, model), how)
        elif kind == "carried-moved-after-edit":
            batch = batch_to(_edit(rng, syncfree.prepare(batch, None, model), how), "cuda")
        elif kind == "carried-edited-after-move":  # (.numpy() needs a host tensor: written in place instead)
            batch = _edit(rng, batch_to(syncfree.prepare(batch, None, model), "cuda"), how.replace("numpy", "inplace"))
        else:
            batch = _edit(rng, syncfree.prepare(batch, "cuda", model), how.replace("numpy", "data"))
        model.to(device)
        try:
            patched = _forward(model, batch, patched=True)
            # (stock takes the grids on the device; prepare() keeps them on the host)
            stock = _forward(model, batch_to({k: v for k, v in batch.items() if k != "syncfree_plan"}, device),
                             patched=False)
        finally:
            model.to("cpu")
    if isinstance(patched, Exception):
        return "refused"
    assert not isinstance(stock, Exception), f"{kind}, {how}: stock raised {stock!r}, syncfree gave logits"
    assert torch.equal(patched, stock), (f"{kind}, {how}: logits differ from stock by "
                                         f"{(patched - stock).abs().max().item()} without an error")
    return "equal"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_random_edits_are_equal_to_stock_or_refused(model, seed):
    base = build_inputs(model.config, named_layout("mixed", side=64), padding_side="left")
    rng = random.Random(seed)
    outcomes = [_one(model, base, rng) for _ in range(100)]
    assert {"equal", "refused"} <= set(outcomes)  # the edits exercise both outcomes
