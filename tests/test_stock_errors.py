"""Inputs stock rejects are rejected with an exception of stock's type (so ``except`` clauses written against
stock keep working), by the patched forward without ``prepare()`` and by ``prepare()`` itself."""

from __future__ import annotations

import pytest
import torch

import syncfree
from family_checks import TINY, model_pair, tiny_family_params, two_rows
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


def _mixed(model) -> dict:
    vc = model.config.vision_config
    unit = vc.patch_size * vc.spatial_merge_size
    return build_inputs(model.config, named_layout("mixed", side=2 * unit, unit=unit), padding_side="left")


def _three_ways(model, batch) -> tuple[BaseException, BaseException, BaseException]:
    """What stock raises on ``batch``, what the patched forward raises without prepare(), what prepare() raises."""
    stock = _raised(lambda: model(**batch))
    syncfree.patch(model)
    try:
        patched = _raised(lambda: model(**batch))
    finally:
        syncfree.unpatch(model)
    return stock, patched, _raised(lambda: syncfree.prepare(batch, "cpu", model))


@pytest.mark.parametrize("case", BAD)
def test_a_bad_input_raises_what_stock_raises(model, case):
    stock, patched, prepared = _three_ways(model, BAD[case](_mixed(model)))
    for err in (patched, prepared):
        assert isinstance(err, type(stock)), f"stock raised {type(stock).__name__}, syncfree {type(err).__name__}: {err}"
        assert isinstance(err, ValueError)  # and syncfree's own contract: a bad input is a ValueError


def _all_padding_row(b):
    return {**b, "attention_mask": torch.cat([b["attention_mask"][:1], torch.zeros_like(b["attention_mask"][1:])])}


def test_a_row_of_padding_only_raises_what_stock_raises(model):
    """Stock's rope index fails on a row without a kept token; the unprepared patched forward hands such a batch
    to stock's own index (so it fails the same way), and prepare() says what is wrong before anything runs."""
    stock, patched, prepared = _three_ways(model, _all_padding_row(_mixed(model)))
    assert type(patched) is type(stock) and str(patched) == str(stock)
    assert isinstance(prepared, type(stock)) and "row 1 of attention_mask is all padding" in str(prepared)


def test_grids_listed_out_of_order_give_stocks_positions_without_prepare(model):
    """Two images of different sizes with their grids swapped: the runs no longer match the grids, and stock
    places the positions its own way (or fails where the totals differ). Without prepare() the patched forward
    gives exactly stock's logits; prepare() refuses the batch."""
    vc = model.config.vision_config
    unit = vc.patch_size * vc.spatial_merge_size
    from syncfree.inputs import Image, Text

    batch = build_inputs(model.config, [[Text(3), Image(2 * unit, 2 * unit), Text(2), Image(2 * unit, 4 * unit),
                                         Text(2)]])
    batch["image_grid_thw"] = batch["image_grid_thw"].flip(0)
    with torch.no_grad():
        expected = model(**batch).logits
    syncfree.patch(model)
    try:
        with torch.no_grad():
            got = model(**batch).logits
    finally:
        syncfree.unpatch(model)
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="placeholder runs"):
        syncfree.prepare(batch, "cpu", model)


# ---- every family: int32 ids, a grid a column short, a zero-size grid --------------------------------------------
def _int32_ids(b):
    return {**b, "input_ids": b["input_ids"].to(torch.int32)}


def _short_grid(b):
    return {**b, "image_grid_thw": b["image_grid_thw"][:, :2]}


def _zero_grid(b):
    g = b["image_grid_thw"].clone()
    g[0] = 0
    return {**b, "image_grid_thw": g}


def _zero_height(b):
    g = b["image_grid_thw"].clone()
    g[0, 1] = 0
    return {**b, "image_grid_thw": g}


FAMILY_BAD = {"int32 input_ids": _int32_ids, "image_grid_thw a column short": _short_grid,
              "zero-size image_grid_thw": _zero_grid, "image_grid_thw of zero height": _zero_height}


def _outcome(fn):
    try:
        with torch.no_grad():
            return fn().logits
    except Exception as err:  # noqa: BLE001 -- what was raised is the point
        return err


@pytest.mark.parametrize("case", FAMILY_BAD)
@pytest.mark.parametrize("model_type", tiny_family_params())
def test_every_family_raises_what_stock_raises_or_gives_stocks_logits(model_type, case):
    """Stock's exception type (syncfree's own one-line error may subclass it), or stock's logits where stock takes the
    input: without prepare() and through prepare()."""
    stock, patched = model_pair(TINY[model_type])
    base = two_rows(stock.config, TINY[model_type])
    if case != "int32 input_ids" and not isinstance(base.get("image_grid_thw"), torch.Tensor):
        pytest.skip(f"{model_type}'s batch has no image_grid_thw")
    batch = FAMILY_BAD[case](base)
    want = _outcome(lambda: stock(**batch))
    for path, got in (("without prepare()", _outcome(lambda: patched(**batch))),
                      ("through prepare()", _outcome(lambda: patched(**syncfree.prepare(batch, "cpu", patched))))):
        if isinstance(want, Exception):
            assert isinstance(got, type(want)), (f"{path}: stock raised {type(want).__name__}: {str(want)[:120]}; "
                                                 f"syncfree {type(got).__name__}: {str(got)[:200]}")
        else:
            assert not isinstance(got, Exception), f"{path}: stock gave logits, syncfree raised {got!r}"[:300]
            assert torch.equal(got, want), f"{path}: logits differ from stock's"


def test_prepare_without_a_model_refuses_a_batch_that_does_not_mark_its_placeholders():
    """Without a model the placeholder ids come from ``mm_token_type_ids``; an Ovis2.5 batch has none, and Qwen3-VL's
    ids would count none of its placeholders. Refused in one line that says to pass the model."""
    if "ovis2_5" not in TINY:
        pytest.skip("this Transformers release has no Ovis2.5")
    stock, _ = model_pair(TINY["ovis2_5"])
    batch = two_rows(stock.config, TINY["ovis2_5"])
    assert "mm_token_type_ids" not in batch
    with pytest.raises(ValueError, match=r"pass the model \(or its config\)") as caught:
        syncfree.prepare(batch)
    assert "\n" not in str(caught.value)
    assert syncfree.prepare(batch, None, stock)  # with the model: planned
