"""VideoLLaMA3: merge sizes per image and video (forward inputs), a tower that un-shuffles each item in a host loop,
video token compression by a boolean mask, Qwen2's text model without 3D positions. Parity with stock over the
processor's layouts (compressed videos included, the attention's weights too), no syncs and no blocking copies with
prepare(), generate (dynamic, static and beams), gradients, the tower alone and compiled, vision_every_step refused."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_forward_equals_stock,
    check_generate_and_backward_equal_stock,
    check_generate_modes_equal_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    standard_layouts,
    traced_copy,
)
from syncfree.audit import assert_no_sync, emulate_cuda
from syncfree.inputs import Image, Text, Video, processor_batch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers.models.video_llama_3") is None,
                                reason="this Transformers release has no VideoLLaMA3")
NAME = "video-llama3-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


def _inputs(config, samples, **options):
    from syncfree.families.videollama3 import build_videollama3_inputs

    return build_videollama3_inputs(config, samples, **options)


# Pixels are multiples of 32 (patch 16 x the videos' merge 2); images are merged 1, so every patch is a placeholder.
LAYOUTS = standard_layouts(32)


def test_the_processor_layout_has_merges_per_item_and_compresses_videos():
    config = _pair()[0].config
    batch = processor_batch(config, LAYOUTS["image and videos"])
    assert "mm_token_type_ids" not in batch
    assert batch["image_merge_sizes"].tolist() == [1] and batch["video_merge_sizes"].tolist() == [2, 2]
    mask = batch["video_compression_mask"]
    videos = batch["video_grid_thw"]
    assert mask.dtype == torch.bool and mask.numel() == int((videos.prod(-1) // 4).sum())
    assert 0 < int(mask.sum()) < mask.numel()  # some tokens of the later frames are dropped, every first frame kept
    first = videos[0, 1] * videos[0, 2] // 4
    assert bool(mask[:first].all())
    ids = batch["input_ids"]
    assert int((ids == config.video_token_id).sum()) == int(mask.sum())
    assert int((ids == config.image_token_id).sum()) == int(batch["image_grid_thw"].prod(-1).sum())
    kept = _inputs(config, LAYOUTS["image and videos"], compress=False)["video_compression_mask"]
    assert bool(kept.all()) and kept.shape == mask.shape


def test_forward_without_compression_equals_stock():
    stock, patched = _pair()
    batch = _inputs(stock.config, LAYOUTS["image and videos"], compress=False)
    check_forward_equals_stock(stock, patched, batch)
    del batch["video_compression_mask"]  # (the forward's default: every video feature kept)
    check_forward_equals_stock(stock, patched, batch)


def test_the_towers_attention_weights_equal_stock():
    stock, patched = _pair("eager")
    batch = processor_batch(stock.config, LAYOUTS["images of different sizes"])
    args = (batch["pixel_values"], batch["image_grid_thw"], batch["image_merge_sizes"])
    with torch.no_grad():
        want = stock.model.get_image_features(*args, output_attentions=True)
        got = patched.model.get_image_features(*args, output_attentions=True)
    assert len(got.attentions) == len(want.attentions) > 0
    for g, w in zip(got.attentions, want.attentions):
        assert len(g) == len(w) == 3 and all(torch.equal(a, b) for a, b in zip(g, w))


def test_the_tower_alone_reads_its_grid_and_merges_once():
    """Called without a plan (on the emulated device) the tower reads its grid and merge sizes once, together, and
    returns stock's features: the per-item loop then runs on host values."""
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and videos"])
    args = (batch["pixel_values_videos"], batch["video_grid_thw"], batch["video_merge_sizes"])
    with torch.no_grad():
        want = stock.model.vision_model(*args).last_hidden_state
        with emulate_cuda():
            patched.to("cuda")
            try:
                moved = [a.to("cuda") for a in args]
                with assert_no_sync(max_syncs=1):
                    got = patched.model.vision_model(*moved).last_hidden_state
                got = got.cpu()
            finally:
                patched.to("cpu")
    assert torch.equal(got, want)


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


@pytest.mark.parametrize("layout", ["videos"])  # (images: the conformance suite)
def test_generate_and_backward_equal_stock_over_compressed_videos(layout):
    stock, patched = _pair()
    samples = ([[Text(2), Image(128, 64), Text(2), Image(48, 64), Text(1)], [Text(1), Image(64, 64), Text(2)]]
               if layout == "images" else [[Text(2), Video(4, 64, 64), Text(1)], [Text(1), Video(3, 64, 96), Text(2)]])
    batch = _inputs(stock.config, samples, padding_side="left")
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    if layout == "videos":
        # Stock's beams cannot take compressed videos in 5.2x (generate() pairs each row's placeholders with the
        # uncompressed features and finds no row boundary; older releases expand the inputs value by value): whatever
        # stock does, the same error or the same ids; without compression, the same ids in every mode.
        beams = dict(options, num_beams=2, num_return_sequences=2)
        want = _outcome(lambda: stock.generate(**batch, **beams))
        got = _outcome(lambda: patched.generate(**syncfree.prepare(batch, None, patched), **beams))
        assert type(got) is type(want) and (got == want if isinstance(want, str) else torch.equal(got, want))
        batch = _inputs(stock.config, samples, padding_side="left", compress=False)
    check_generate_modes_equal_stock(stock, patched, batch, options)


def _outcome(run):
    """What ``run`` returns, or the message of the ValueError it raises."""
    try:
        with torch.no_grad():
            return run()
    except ValueError as exc:
        return str(exc)


def test_prepare_refuses_a_compression_mask_of_another_length():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["video"])
    batch["video_compression_mask"] = batch["video_compression_mask"][1:]
    with pytest.raises(ValueError, match="video_compression_mask has shape"):
        syncfree.prepare(batch, None, patched)


def test_the_patched_towers_graph_breaks_are_its_own_item_loop():
    """Stock un-shuffles each item in a Python loop sized by its grid and merge size: on the plan's host values that
    is no sync, but a tower traced on its own breaks the graph there (stock's expression, evaluated by the rewritten
    line's helper: only the whole planned forward hands it the plan's integers); nothing else breaks."""
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(96, 128), Image(64, 32)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    explained = torch._dynamo.explain(traced_copy(patched.model.vision_model))(
        batch["pixel_values"], grid_thw=plan.grid_thw, merge_sizes=plan.merge_sizes, syncfree_vision_plan=plan)
    assert explained.graph_break_count >= 1
    for reason in explained.break_reasons:  # (its split by the host grid's .tolist(): no sync, a break)
        assert reason.user_stack[-1].name in ("pixel_unshuffle", "grid_products"), reason
        assert "grid_thw.prod(dim=1).tolist()" in str(reason.user_stack[-1].line), reason


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.sampled_from([1, 2])),
                     min_size=1, max_size=4))
def test_rotary_ids_with_merges_per_row_equal_stocks(rows):
    """The plan's rotary ids, made on the device with each row's merge, against stock's helper on the host."""
    from transformers.vision_utils import get_vision_position_ids

    from syncfree.plan.spec import ModelSpec
    from syncfree.plan.vision import vision_plan

    grid = torch.tensor([(t, h * m, w * m) for t, h, w, m in rows])
    merges = torch.tensor([m for *_, m in rows])
    vp = vision_plan(grid, ModelSpec.from_config(_pair()[0].config), merge_sizes=merges)
    assert vp.tables_by_device
    assert torch.equal(vp.position_ids, get_vision_position_ids(grid, merges))
    assert list(vp.split_sizes) == (grid.prod(-1) // merges**2).tolist()

