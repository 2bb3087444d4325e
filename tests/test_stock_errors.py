"""Inputs stock rejects are rejected with an exception of stock's type (so ``except`` clauses written against
stock keep working), by the patched forward without ``prepare()`` and by ``prepare()`` itself."""

from __future__ import annotations

import pytest
import torch

import syncfree
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import build_model

MODELS = ("qwen3-vl-tiny", "qwen2.5-vl-tiny", "qwen2-vl-tiny")


def _zero(b):
    g = b["image_grid_thw"].clone()
    g[0, 1] = 0
    return {**b, "image_grid_thw": g}


def _odd(b):
    g = b["image_grid_thw"].clone()
    g[0, 1] += 1
    return {**b, "image_grid_thw": g}


def _float(b):
    return {**b, "image_grid_thw": b["image_grid_thw"].float()}


def _wide_mask(b):
    return {**b, "attention_mask": torch.cat([b["attention_mask"], b["attention_mask"][:, :3]], 1)}


BAD = {"zero-size grid": _zero, "grid not a multiple of the merge size": _odd, "float grid": _float,
       "mask wider than the tokens": _wide_mask}


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return build_model(request.param)


def _raised(fn) -> BaseException:
    try:
        with torch.no_grad():
            fn()
    except Exception as err:  # noqa: BLE001 -- what was raised is the point
        return err
    pytest.fail("no exception")


@pytest.mark.parametrize("case", BAD)
def test_a_bad_input_raises_what_stock_raises(model, case):
    vc = model.config.vision_config
    unit = vc.patch_size * vc.spatial_merge_size
    layout = named_layout("mixed", side=2 * unit, unit=unit)
    batch = BAD[case](build_inputs(model.config, layout, padding_side="left"))
    stock = _raised(lambda: model(**batch))
    syncfree.patch(model)
    try:
        patched = _raised(lambda: model(**batch))
    finally:
        syncfree.unpatch(model)
    prepared = _raised(lambda: syncfree.prepare(batch, "cpu", model))
    for err in (patched, prepared):
        assert isinstance(err, type(stock)), f"stock raised {type(stock).__name__}, syncfree {type(err).__name__}: {err}"
        assert isinstance(err, ValueError)  # and syncfree's own contract: a bad input is a ValueError
