"""MiniCPM-V 4.7's own pieces beyond 4.6's (tests/test_patch_minicpm.py runs the shared checks on it): the processor's
token types and video frames without ids; its canvas M-RoPE index (host Python over ``input_ids.tolist()``), which the
plan runs as stock on the host copies, against stock's index over random layouts; the rope deltas the decode steps
read; and generate() from a prepared batch on the (emulated) device: no wait in the modeling code, prefill or decode
(the generation loop's own checks are all that is left)."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import check_host_index_is_stocks, model_pair
from syncfree.audit import audit, emulate_cuda
from syncfree.families.minicpm import MARKERS, build_minicpm_inputs
from syncfree.inputs import Image, Text, Video
from syncfree.presets import PRESETS, build_model

# (Skipped only where Transformers ships no MiniCPM-V 4.7, 5.17: where it does, syncfree must support it.)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers.models.minicpmv4_7") is None,
                                reason="this Transformers release has no MiniCPM-V 4.7")

PRESET = "minicpmv4-7-tiny"
U = 56  # the pixel unit: patch 14 x the "16x" merge (4 on a side)
MODELING = "models/minicpmv4_7/modeling_minicpmv4_7.py"
GENERATE = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
_ROPE_ARGS = ("input_ids", "mm_token_type_ids", "target_sizes", "target_sizes_videos", "attention_mask")


def test_the_family_is_fully_supported():
    assert "minicpmv4_7" in syncfree.families.FAMILIES
    assert "minicpmv4_7" in syncfree.plan.spec.supported_model_types()


def _stock_index(stock, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return stock.model.get_rope_index(**{k: batch.get(k) for k in _ROPE_ARGS})


def test_videos_carry_no_id_and_placeholders_are_typed():
    """4.7's processor writes an id before each image only, and types image placeholders 1, video placeholders 2."""
    config = model_pair(PRESET)[0].config
    batch = build_minicpm_inputs(config, [[Image(U, U), Video(2, U, U), Image(U, U)]])
    ids = batch["input_ids"][0].tolist()
    m = MARKERS
    frame = [m["image_start"]] + [config.video_token_id] + [m["image_end"]]
    image = [m["image_start"], config.image_token_id, m["image_end"]]
    assert ids == ([m["id_start"], m["digit0"], m["id_end"]] + image + frame * 2
                   + [m["id_start"], m["digit0"] + 1, m["id_end"]] + image)
    types = batch["mm_token_type_ids"][0].tolist()
    assert types == [1 if i == config.image_token_id else 2 if i == config.video_token_id else 0 for i in ids]


side = st.integers(1, 3).map(lambda n: U * n)
large = st.integers(5, 9).map(lambda n: U * n)  # (more than SLICE merged tokens on a side: a thumbnail and slices)
items = st.one_of(st.builds(Text, st.integers(1, 3)), st.builds(Image, side, side), st.builds(Image, large, side),
                  st.builds(Video, st.integers(1, 3), side, side), st.builds(Video, st.integers(1, 2), large, large))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3), left=st.booleans(),
       seed=st.integers(0, 2**16))
def test_the_plans_positions_are_stocks_canvas_index(rows, left, seed):
    """The plan's positions (stock's index on the host copies), the patched index without a plan (one read, then the
    same) and on a prepared batch (its plan's) against stock's index on the batch: every axis, row and delta, over
    thumbnails with and without slices, video frames (a group of adjacent frames), text between, either padding."""
    stock, patched = model_pair(PRESET)
    batch = build_minicpm_inputs(stock.config, rows, padding_side="left" if left else "right", seed=seed)
    if "target_sizes" not in batch and "target_sizes_videos" not in batch:
        return  # (a text-only batch: stock computes no canvas positions)
    want = _stock_index(stock, batch)
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
    prepared = syncfree.prepare(batch, "cpu", patched)  # (registered: the index answers from its plan)
    for got in ((plan.position_ids, plan.rope_deltas), _stock_index(patched, batch), _stock_index(patched, prepared)):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)


def test_the_published_configs_plan_is_stocks():
    """The published vision config names no ``spatial_merge_size`` (the tiny preset's tells the CLI its pixel unit):
    the plan's index, stock's on the host, needs none, and the forward is stock's."""
    from transformers import MiniCPMV4_7Config, MiniCPMV4_7ForConditionalGeneration

    values = dict(PRESETS[PRESET].values)
    values["vision_config"] = {k: v for k, v in values["vision_config"].items() if k != "spatial_merge_size"}
    config = MiniCPMV4_7Config(**values)
    assert not hasattr(config.vision_config, "spatial_merge_size")
    torch.manual_seed(0)
    stock = MiniCPMV4_7ForConditionalGeneration(config).eval()
    patched = syncfree.patch(copy.deepcopy(stock))
    batch = build_minicpm_inputs(config, [[Text(2), Image(6 * U, 2 * U), Text(1)], [Video(2, U, U)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
    for g, w in zip((plan.position_ids, plan.rope_deltas), _stock_index(stock, batch)):
        assert torch.equal(g, w)
    with torch.no_grad():
        assert torch.equal(patched(**syncfree.prepare(batch, None, patched)).logits, stock(**batch).logits)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_forward_caches_stocks_rope_deltas(padding):
    """A sliced image and a video: the same logits as stock, and the deltas the decode steps add (cached by the
    forward's ``compute_3d_position_ids``) are stock's, with and without prepare()."""
    stock, patched = model_pair(PRESET)
    batch = build_minicpm_inputs(stock.config, [[Text(2), Image(7 * U, 3 * U), Video(2, U, 2 * U), Text(1)],
                                                [Text(1), Image(U, U)]], padding_side=padding)
    with torch.no_grad():
        want = stock(**batch).logits
        deltas = stock.model.rope_deltas
        for inputs in (batch, syncfree.prepare(batch, None, patched)):
            patched.model.rope_deltas = None
            assert torch.equal(patched(**inputs).logits, want)
            assert torch.equal(patched.model.rope_deltas, deltas)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_waits_for_nothing_in_the_modeling_code(cache):
    """generate() from a prepared batch on the emulated device: the position setup (4 rows: text, then the canvas),
    the prefill and every decode step (positions from the cached deltas) read nothing from the device in the modeling
    code, and the ids and the cached deltas are stock's."""
    stock = model_pair(PRESET)[0]
    patched = syncfree.patch(build_model(PRESET))  # (the same weights; one no compiled test has held: it moves)
    batch = build_minicpm_inputs(stock.config, [[Text(2), Image(6 * U, 2 * U), Text(1)], [Video(2, U, U), Text(2)]])
    options = dict(GENERATE, **({"cache_implementation": "static"} if cache == "static" else {}))
    with torch.no_grad():
        expected = stock.generate(**batch, **options)
        deltas = stock.model.rope_deltas
        with emulate_cuda():
            patched.to("cuda")
            try:
                with audit() as report:
                    ids = patched.generate(**syncfree.prepare(batch, "cuda", patched), **options)
                ids, got_deltas = ids.cpu(), patched.model.rope_deltas.cpu()
            finally:
                patched.to("cpu")
                patched.model.rope_deltas = None
    assert torch.equal(ids, expected)
    assert torch.equal(got_deltas, deltas)
    assert not [e for e in report.syncs if e.where and MODELING in str(e.where)]
    assert not [e for e in report.blocking_copies if e.where and MODELING in str(e.where)]
    # What is left is the generation loop's own (its stopping checks); with the static cache, generate() makes the
    # padding mask itself, and the linear-attention layers' all-ones check reads that one (not the plan's).
    left = [str(e.where) for e in report.syncs if "transformers/generation/" not in str(e.where)]
    assert left == [] if cache == "dynamic" else all("create_recurrent_attention_mask" in w for w in left)


def test_a_call_without_token_types_falls_back_as_stock_does():
    """Without ``mm_token_type_ids`` stock refuses multimodal positions with its own error; the patched forward too."""
    stock, patched = model_pair(PRESET)
    batch = build_minicpm_inputs(stock.config, [[Text(2), Image(U, U)]])
    del batch["mm_token_type_ids"]
    with torch.no_grad():
        with pytest.raises(ValueError, match="mm_token_type_ids` is missing") as want:
            stock(**batch)
        with pytest.raises(ValueError, match="mm_token_type_ids` is missing") as got:
            patched(**batch)
    assert str(got.value) == str(want.value)


# Token edits that break the processor's layout in the ways stock's walk reads it: a marker dropped or doubled, text
# between frames or slices, a newline where a ``</slice>`` was, two crops made to touch, a crop at a row's start.
_EDITS = st.lists(st.tuples(st.sampled_from(["drop", "insert", "replace"]), st.integers(0, 10**6),
                            st.sampled_from(["text", *MARKERS])), max_size=3)


def _edited(batch: dict, edits, config) -> dict:
    """``batch`` with its first row's kept tokens edited (ids and types together; padding kept at its side)."""
    ids, types, mask = (batch[n][0].tolist() for n in ("input_ids", "mm_token_type_ids", "attention_mask"))
    kept = [i for i, m in enumerate(mask) if m]
    row = [(ids[i], types[i]) for i in kept]
    for op, at, what in edits:
        token = (7, 0) if what == "text" else (MARKERS[what], 0)
        at = at % (len(row) + 1)
        if op == "drop" and at < len(row) and len(row) > 1:
            del row[at]
        elif op == "insert":
            row.insert(at, token)
        elif op == "replace" and at < len(row):
            row[at] = token
    S = max(len(row), batch["input_ids"].shape[1])
    out = {k: v for k, v in batch.items()}
    left = mask[0] == 0 or (mask[-1] == 1 and kept and kept[0] > 0)
    new = {}
    for name, values, pad in (("input_ids", [i for i, _ in row], 0), ("mm_token_type_ids", [t for _, t in row], 0),
                              ("attention_mask", [1] * len(row), 0)):
        rows = [values] + [batch[name][r].tolist() for r in range(1, batch[name].shape[0])]
        widths = [len(r) for r in rows]
        padded = [([pad] * (S - w) + r if left else r + [pad] * (S - w)) if i == 0 else
                  ([pad] * (S - w) + r if left else r + [pad] * (S - w)) for i, (r, w) in enumerate(zip(rows, widths))]
        new[name] = torch.tensor(padded, dtype=batch[name].dtype)
    out.update(new)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3), left=st.booleans(),
       seed=st.integers(0, 2**16), edits=_EDITS, masked=st.booleans())
def test_the_numpy_canvas_index_is_stocks(rows, left, seed, edits, masked):
    """The plan's NumPy canvas index (``families/minicpm/canvas_rope``) against stock's own ``get_rope_index`` run on
    the same host tensors, over random layouts (thumbnails with and without slices, video frames, text-only rows,
    either padding, with and without a mask) and the same with a few tokens dropped, inserted or replaced: where it
    answers, every position and delta is stock's; where it does not (a layout it does not model), the plan runs stock's
    own index. The processor's own layouts it must answer."""
    from syncfree.families.minicpm.canvas_rope import canvas_rope_index

    config = model_pair(PRESET)[0].config
    batch = build_minicpm_inputs(config, rows, padding_side="left" if left else "right", seed=seed)
    if edits:
        batch = _edited(batch, edits, config)
    names = ("input_ids", "mm_token_type_ids", "target_sizes", "target_sizes_videos")
    check_host_index_is_stocks(canvas_rope_index, config, batch, names, masked, bool(edits))


@pytest.mark.parametrize("crop", [0, 1, -1])
def test_the_numpy_canvas_index_is_stocks_with_a_crop_of_negative_sides(crop):
    """A crop whose ``target_sizes`` row is negated keeps its token count (the product of the sides), so only its
    signs are wrong: the NumPy index answers as stock's own index, or leaves the batch to it."""
    from syncfree.families.minicpm.canvas_rope import canvas_rope_index

    config = model_pair(PRESET)[0].config
    batch = build_minicpm_inputs(config, [[Text(3), Image(2 * U, 2 * U), Text(2), Image(U, U), Text(1)]], seed=0)
    batch["target_sizes"] = batch["target_sizes"].clone()
    batch["target_sizes"][crop] *= -1
    names = ("input_ids", "mm_token_type_ids", "target_sizes", "target_sizes_videos")
    check_host_index_is_stocks(canvas_rope_index, config, batch, names, masked=False, edited=True)
