"""MiniCPM-OCR ("4x"), MiniCPM-V 4.6 and 4.7 ("16x": a window merger inside the tower): a NaViT tower whose crops come as
(h, w) target_sizes rows, a per-crop merger after it, Qwen3.5's text model (4.7: with its canvas M-RoPE). Parity with stock over
the processor's layouts (thumbnails and slices, videos), no syncs and no blocking copies with prepare(), generate
(dynamic, static and beams), gradients, the tower under compile, and a call's other downsample mode."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_forward_equals_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    standard_layouts,
    traced_copy,
)
from syncfree.families.minicpm import MARKERS, SLICE, build_minicpm_inputs
from syncfree.inputs import Image, Text, processor_batch


def _family(folder: str, preset: str, unit: int, wherever_shipped: bool = False):
    """``wherever_shipped``: run wherever Transformers ships the family (4.7: only 5.24 has it, and syncfree must
    support it there), not only where syncfree registers it (4.6 and OCR: 5.17's older code is left stock)."""
    skip = (importlib.util.find_spec(f"transformers.models.{folder}") is None if wherever_shipped
            else folder not in syncfree.families.FAMILIES)
    return pytest.param((folder, preset, unit), id=folder,
                        marks=pytest.mark.skipif(skip, reason=f"this Transformers release has no {folder} syncfree supports"))


# (family folder, tiny preset, pixel unit: patch 14 x the merge on a side, 2 in "4x", 4 in "16x")
FAMILIES = [_family("minicpm_ocr", "minicpm-ocr-tiny", 28), _family("minicpmv4_6", "minicpmv4-6-tiny", 56),
            _family("minicpmv4_7", "minicpmv4-7-tiny", 56, wherever_shipped=True)]
LAYOUT_NAMES = ("one image", "images of different sizes", "video", "image and videos", "padding and a text-only row",
                "a sliced image")


def _layouts(unit: int) -> dict:
    """The shared layouts, and an image large enough to be sliced (a thumbnail, then rows of slices)."""
    return {**standard_layouts(unit),
            "a sliced image": [[Text(2), Image(9 * unit, 6 * unit), Text(1), Image(unit, unit), Text(2)], [Text(3)]]}


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


def test_the_processor_layout(family):
    """An image is its id, its thumbnail between <image> markers, then its slices row by row; no token types (4.7's
    processor types the placeholders 1)."""
    folder, name, unit = family
    config = model_pair(name)[0].config
    batch = processor_batch(config, [[Text(1), Image(9 * unit, 6 * unit)]])
    assert {"target_sizes", "pixel_values"} <= set(batch)
    if folder == "minicpmv4_7":
        assert torch.equal(batch.pop("mm_token_type_ids"), (batch["input_ids"] == config.image_token_id).long())
    assert "mm_token_type_ids" not in batch
    rows, cols = -(-9 // SLICE), -(-6 // SLICE)  # slices of SLICE x SLICE merged tokens
    thumb = (round(9 * SLICE / 9), round(6 * SLICE / 9))
    m, img = MARKERS, config.image_token_id
    want = [m["id_start"], m["digit0"], m["id_end"], m["image_start"]] + [img] * (thumb[0] * thumb[1]) + [m["image_end"]]
    for r in range(rows):
        want += [m["newline"]] if r else []
        want += ([m["slice_start"]] + [img] * SLICE**2 + [m["slice_end"]]) * cols
    assert batch["input_ids"][0, 1:].tolist() == want
    merge = unit // config.vision_config.patch_size
    assert batch["target_sizes"].tolist() == ([[merge * thumb[0], merge * thumb[1]]]
                                              + [[merge * SLICE, merge * SLICE]] * (rows * cols))
    assert batch["pixel_values"].shape[-1] == batch["target_sizes"].prod(-1).sum() * config.vision_config.patch_size


# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", ["a sliced image"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_equals_stock_on_its_own_layouts(family, attn, layout, padding):
    stock, patched = model_pair(family[1], attn)
    check_forward_equals_stock(stock, patched, build_minicpm_inputs(stock.config, _layouts(family[2])[layout],
                                                                    padding_side=padding))


def test_a_calls_other_downsample_mode_equals_stock(family):
    """``downsample_mode`` passed to the forward (the other one than the config's: "16x" on MiniCPM-OCR runs the window
    merger, "4x" on 4.6 skips it): not what the plan's split sizes were made for, still stock's result."""
    from syncfree.presets import build_model

    name = family[1]
    stock, patched = build_model(name), build_model(name)
    for model in (stock, patched):
        model.config.vision_config.insert_layer_id = 0  # (the tiny tower reaches the window merger)
    patched = syncfree.patch(patched)
    other = "16x" if stock.config.downsample_mode == "4x" else "4x"
    config = type(stock.config).from_dict({**stock.config.to_dict(), "downsample_mode": other})
    batch = build_minicpm_inputs(config, [[Text(2), Image(224, 224), Text(1), Image(112, 224)], [Text(1)]])
    with torch.no_grad():
        want = stock(**batch, downsample_mode=other).logits
        assert torch.equal(patched(**batch, downsample_mode=other).logits, want)


def test_prepared_prefill_has_no_sync_and_no_blocking_copy(family):
    stock, patched = model_pair(family[1])
    layouts = _layouts(family[2])
    batch = processor_batch(stock.config, layouts["image and videos"] + layouts["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


@pytest.mark.slow  # (an Inductor compile of the tower)
def test_the_patched_tower_compiles_without_a_graph_break(family):
    """Handed the plan alone (``compile_vision``'s way), the tower's position ids, cumulative lengths and splits come
    from it: no break in "4x"; in "16x" the window merger builds its tables from the host sizes (the whole forward
    traced with its plan builds them from the plan's rows: the test below), and the result is still stock's."""
    _, patched = model_pair(family[1])
    u = family[2]
    batch = processor_batch(patched.config, [[Image(3 * u, 4 * u), Image(2 * u, u)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
    tower, sizes = traced_copy(patched.model.vision_tower), plan.host["target_sizes"]
    explained = torch._dynamo.explain(tower)(batch["pixel_values"], target_sizes=sizes,
                                             syncfree_vision_plan=plan.image)
    if family[0] == "minicpm_ocr":  # ("4x": no window merger)
        assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    else:  # (the window merger's tables: made from the host sizes, which a graph cannot read)
        assert explained.graph_break_count > 0
    with torch.no_grad():
        want = model_pair(family[1])[0].model.vision_tower(batch["pixel_values"], target_sizes=batch["target_sizes"])
        got = torch.compile(tower)(batch["pixel_values"], target_sizes=sizes, syncfree_vision_plan=plan.image)
    # (Inductor fuses differently from eager: close, not bit for bit.)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)


@pytest.mark.slow  # (a Dynamo trace per layout)
@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_whole_prepared_forward_compiles_as_one_graph_with_the_eager_logits(family, layout):
    """The presets run the window merger inside the tower ("16x", ``insert_layer_id=0``), which the census models do
    not reach: every crop size the tower, the window merger and the merger read is the plan's, so the whole prepared
    forward traces as one graph (``fullgraph=True``), with the eager logits, slices and videos included."""
    _, patched = model_pair(family[1])
    model = traced_copy(patched)
    batch = processor_batch(model.config, _layouts(family[2])[layout])
    with torch.no_grad():
        expected = model(**syncfree.prepare(batch, "cpu", model)).logits
        got = torch.compile(model, fullgraph=True, backend="eager")(**syncfree.prepare(batch, "cpu", model)).logits
    torch._dynamo.reset()
    assert torch.equal(got, expected)


@settings(max_examples=150, deadline=None)
@given(side=st.integers(1, 4), crops=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=1, max_size=5))
def test_window_order_built_from_the_rows_is_stocks_window_index(side, crops):
    """What a traced forward builds for the window merger from the plan's rows (crops that whole windows tile) equals
    the installed stock ``get_window_index`` on those sizes: the same patch order and window boundaries."""
    from syncfree.families.minicpm.navit import window_order

    folder = next((f for f in ("minicpmv4_6", "minicpmv4_7", "minicpm_ocr") if f in syncfree.families.FAMILIES), None)
    if folder is None:
        pytest.skip("no MiniCPM family is registered with this Transformers release")
    modeling = importlib.import_module(f"transformers.models.{folder}.modeling_{folder}")
    merger = next(c for n, c in vars(modeling).items() if n.endswith("ViTWindowAttentionMerger"))
    stand_in = type("Merger", (), {"window_kernel_size": (side, side)})()
    rows = [(h * side, w * side) for h, w in crops]
    want_order, want_bounds, _ = merger.get_window_index(stand_in, torch.tensor(rows, dtype=torch.int32))
    order, bounds = window_order(rows, side, "cpu")
    assert torch.equal(order, want_order) and torch.equal(bounds, want_bounds.to(bounds.dtype))
    assert bounds.dtype == want_bounds.dtype


def test_refusals_name_the_crop_sizes_the_batch_carries():
    """MiniCPM-V 4.6's batch carries its crops as ``target_sizes``, not ``image_grid_thw``: the one-line refusals of a
    bad batch name the input the user has."""
    from family_checks import TINY, model_pair, two_rows

    if "minicpmv4_6" not in TINY:
        pytest.skip("syncfree registers no MiniCPM-V 4.6 for this Transformers release")
    stock, patched = model_pair(TINY["minicpmv4_6"])
    batch = two_rows(stock.config, TINY["minicpmv4_6"])
    ids = batch["input_ids"].clone()
    ids.view(-1)[(ids.view(-1) == stock.config.image_token_id).nonzero()[0]] = 1
    odd = batch["target_sizes"].clone()
    odd[0, 0] += 1
    for edited in ({**batch, "input_ids": ids}, {**batch, "target_sizes": odd},
                   {**batch, "target_sizes": batch["target_sizes"].float()}):
        with pytest.raises(ValueError) as caught:
            syncfree.prepare(edited, "cpu", patched)
        assert "target_sizes" in str(caught.value) and "image_grid_thw" not in str(caught.value), str(caught.value)
