"""``syncfree.Buckets``: a batch padded up to a bucket (tokens on the right, filler images after a row's last token)
gives the real tokens the unbucketed batch's outputs, and a stream of layouts makes as many shapes as buckets hit.

Equality is to rounding, not bitwise: the padded batch runs the same ops on longer rows and more patches, and the
kernels' blocking depends on the shapes. The bound is ``torch.testing.assert_close``'s for float32 (rtol 1.3e-6,
atol 1e-5); the differences seen are below 7e-7.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounter

import syncfree
from family_checks import TINY, installed, unit_of
from syncfree.buckets import _fillers, bucket_batch
from syncfree.families import PRESETS
from syncfree.inputs import Image, Text, Video, processor_batch, stream_layouts
from syncfree.plan.spec import layout_of
from syncfree.presets import build_model

BUCKETS = syncfree.Buckets(tokens=(32, 64, 128), patches=(64, 128, 256), items=(4, 8))
STREAM = [f for f in TINY if layout_of(f) is not None and layout_of(f).stream]


def _model(family: str):
    return syncfree.patch(build_model(TINY[family])).eval()


def _batch(model, samples, padding_side: str = "right") -> dict:  # (buckets take right-padded batches)
    return processor_batch(model.config, samples, padding_side=padding_side,
                           pad_token_id=PRESETS[TINY[model.config.model_type]].pad_token_id)


def _samples(unit: int) -> list:
    return [[Text(5), Image(2 * unit, 2 * unit), Text(3)], [Text(9), Image(unit, 3 * unit)]]


# (families whose processor puts no marker around an image, or whose tower has no spatial_merge_size: refused)
REFUSED = {"hy_v4_vl", "dots3_note", "exaone4_5", "muse_glimmer", "muse_spark", "kimi_k25"}
# (families whose batches carry inputs of their own beside the images': refused by name)
OWN_INPUTS = {"ernie4_5_vl_moe", "video_llama_3", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7", "glm_image"}
IMAGES = [f for f in TINY if f != "qwen3_asr"]


def _family_param(family: str):
    skip = pytest.mark.skipif(not installed(family), reason=f"this Transformers release has no {family}")
    return pytest.param(family, marks=[skip] if family in STREAM else [skip, pytest.mark.slow])


@pytest.mark.parametrize("family", [_family_param(f) for f in IMAGES if f not in REFUSED | OWN_INPUTS])
def test_the_real_tokens_of_a_bucketed_batch_get_the_unbucketed_logits(family):
    model = _model(family)
    batch = _batch(model, _samples(unit_of(model.config)))
    padded = bucket_batch(batch, BUCKETS, model.config, processor_batch)
    rows, length = batch["input_ids"].shape
    assert padded["input_ids"].shape[0] == rows and padded["input_ids"].shape[1] in BUCKETS.tokens
    assert padded["pixel_values"].shape[0] in BUCKETS.patches and padded["image_grid_thw"].shape[0] in BUCKETS.items
    with torch.no_grad():
        expected = model(**syncfree.prepare(batch, "cpu", model)).logits
        got = model(**syncfree.prepare(batch, "cpu", model, buckets=BUCKETS)).logits
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[:, :length][real], expected[real])


@pytest.mark.parametrize("family", [_family_param(f) for f in sorted(REFUSED | OWN_INPUTS) if f in TINY])
def test_a_family_buckets_cannot_pad_is_refused_in_one_line_naming_it_or_its_input(family):
    model = _model(family)
    batch = _batch(model, _samples(unit_of(model.config)))
    with pytest.raises(ValueError) as raised:
        syncfree.prepare(batch, "cpu", model, buckets=BUCKETS)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("syncfree buckets")
    assert family in message or "this batch also has" in message


def test_what_buckets_add_is_masked_or_a_filler_image_with_no_labels():
    model = _model("qwen2_5_vl")
    batch = _batch(model, _samples(unit_of(model.config)))
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    padded = bucket_batch(batch, BUCKETS, model.config, processor_batch)
    length = batch["input_ids"].shape[1]
    assert torch.equal(padded["input_ids"][:, :length][batch["attention_mask"].bool()],
                       batch["input_ids"][batch["attention_mask"].bool()])
    added = torch.ones_like(padded["attention_mask"], dtype=torch.bool)
    added[:, :length] = batch["attention_mask"] == 0
    assert (padded["labels"][added] == -100).all()
    # (the attended tokens added are the filler images' own: placeholders and their markers, after a row's last token)
    fillers = padded["attention_mask"].bool() & added
    merge = model.config.vision_config.spatial_merge_size
    placeholders = (padded["input_ids"][fillers] == model.config.image_token_id).sum()
    grids = padded["image_grid_thw"]
    assert int(placeholders) == int(grids.prod(1).sum() - batch["image_grid_thw"].prod(1).sum()) // merge ** 2


def test_a_stream_through_buckets_makes_one_shape_per_bucket_and_the_graphs_do_not_grow():
    model = _model("qwen3_vl")
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    shapes: dict[tuple, set] = {}
    with torch.no_grad():
        for samples in stream_layouts(16, unit_of(model.config), videos=False):
            kwargs = syncfree.prepare(_batch(model, samples), "cpu", model, buckets=BUCKETS)
            key = (tuple(sorted(kwargs)), BUCKETS.key(kwargs))
            shapes.setdefault(key, set()).add(tuple((n, tuple(v.shape)) for n, v in sorted(kwargs.items())
                                                    if isinstance(v, torch.Tensor)))
            expected = model(**syncfree.prepare(_batch(model, samples), "cpu", model, buckets=BUCKETS)).logits
            assert torch.equal(compiled(**kwargs).logits, expected)
    assert all(len(found) == 1 for found in shapes.values())
    assert 1 < len(shapes) and counter.frame_count <= len(shapes)


@pytest.mark.parametrize("make,message", [
    (lambda u: [[Text(130), Image(u, u)]], "no bucket holds rows of"),
    (lambda u: [[Text(3)] + [Image(3 * u, 3 * u)] * 8], "no bucket holds 8 images of 288 patches"),
    (lambda u: [[Text(3), Video(2, u, u)]], "this batch has videos"),
    (lambda u: [[Text(3)], [Text(5)]], "padded on the left"),
])
def test_a_batch_no_bucket_holds_is_refused_in_one_line_naming_the_size(make, message):
    model = _model("qwen2_vl")
    side = "left" if "left" in message else "right"
    with pytest.raises(ValueError, match=message) as raised:
        syncfree.prepare(_batch(model, make(unit_of(model.config)), side), "cpu", model, buckets=BUCKETS)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("args,message", [
    (dict(tokens=()), "at least one size of tokens"),
    (dict(tokens=(64, 0)), "positive ints"),
    (dict(tokens=(64,), patches=(64,)), "patches and items together"),
    (dict(tokens=(64, 64)), "a size twice"),
])
def test_buckets_refuse_sizes_that_make_no_bucket(args, message):
    with pytest.raises(ValueError, match=message):
        syncfree.Buckets(**args)


def test_buckets_need_the_model_and_refuse_a_batch_planned_before():
    model = _model("qwen2_vl")
    batch = _batch(model, _samples(unit_of(model.config)))
    with pytest.raises(ValueError, match="needs the model"):
        syncfree.prepare(batch, "cpu", buckets=BUCKETS)
    with pytest.raises(ValueError, match="planned before it was bucketed"):
        syncfree.prepare(syncfree.prepare(batch, None, model), "cpu", model, buckets=BUCKETS)
    planned = syncfree.prepare(syncfree.prepare(batch, None, model, buckets=BUCKETS), "cpu", model, buckets=BUCKETS)
    assert planned["input_ids"].shape[1] in BUCKETS.tokens


def _first(features: list) -> dict:
    return features[0]


def test_the_planning_collator_buckets_in_the_worker_and_pickles():
    model = _model("qwen2_vl")
    batch = _batch(model, _samples(unit_of(model.config)))
    collate = pickle.loads(pickle.dumps(syncfree.planning_collator(_first, model, buckets=BUCKETS)))
    in_worker = collate([batch])
    direct = syncfree.prepare(batch, None, model, buckets=BUCKETS)
    assert in_worker.keys() == direct.keys()
    for name, value in direct.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(in_worker[name], value), name
    with torch.no_grad():
        assert torch.equal(model(**syncfree.prepare(in_worker, "cpu", model)).logits,
                           model(**syncfree.prepare(batch, "cpu", model, buckets=BUCKETS)).logits)


@given(items=st.integers(0, 12), patches=st.integers(0, 400), merge=st.sampled_from([1, 2, 4]))
def test_filler_images_take_exactly_the_missing_images_and_patches_or_none_when_they_cannot(items, patches, merge):
    widths = _fillers(items, patches, merge)
    least = merge * merge
    possible = (items == 0 and patches == 0) or (items > 0 and patches >= items * least and patches % least == 0)
    assert (widths is not None) == possible
    if widths is not None:
        assert len(widths) == items and sum(merge * w for w in widths) == patches
        assert all(w >= merge and w % merge == 0 for w in widths)


@given(max_tokens=st.integers(1, 10_000), max_patches=st.integers(0, 50_000), max_items=st.integers(0, 64))
def test_powers_of_two_double_from_the_smallest_up_to_the_max_included(max_tokens, max_patches, max_items):
    made = syncfree.Buckets.powers_of_two(max_tokens, max_patches if max_items else 0, max_items if max_patches else 0)
    for sizes, most in ((made.tokens, max_tokens), (made.patches, max_patches), (made.items, max_items)):
        if not sizes:
            continue
        assert sizes[-1] == most and all(b == 2 * a for a, b in zip(sizes[:-2], sizes[1:-1]))
    assert made.tokens[0] == min(64, max_tokens)


def test_a_packed_batch_is_refused_by_buckets_in_one_line():
    model = _model("qwen2_vl")
    unit = unit_of(model.config)
    samples = [_batch(model, [sample]) for sample in _samples(unit)]
    packed = syncfree.packing_collator(model, max_tokens=64)(samples)
    with pytest.raises(ValueError, match="this one is packed") as raised:
        syncfree.prepare(packed, "cpu", model, buckets=BUCKETS)
    assert "\n" not in str(raised.value)


def test_a_bucketed_stream_of_layouts_is_sync_free_on_the_emulated_device():
    model = _model("qwen3_vl")
    with syncfree.emulate_cuda():
        model.to("cuda")
        try:
            for samples in stream_layouts(6, unit_of(model.config), videos=False):
                kwargs = syncfree.prepare(_batch(model, samples), "cuda", model, buckets=BUCKETS)
                with syncfree.audit() as report, torch.no_grad():
                    model(**kwargs)
                assert report.syncs == []
        finally:
            model.to("cpu")
