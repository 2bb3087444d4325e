"""Kimi-K2.5: MoonViT (2D axial rotary ids in raster order, a bicubically resampled learned table, a frame embedding,
one attention segment per clip, each clip's frames averaged after the encoder) and DeepSeek-V3's MoE text model,
without 3D positions. The processor's layout (checked against the installed processor's own code), the plan's tables
against stock's helpers on random grids, parity with stock over the processor's layouts, no syncs and no blocking
copies with prepare() (bf16), generate (dynamic, static and beams), gradients, compile, stock's placeholder error."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
import syncfree.families
from family_checks import (
    check_forward_equals_stock,
    check_generate_and_backward_equal_stock,
    check_generate_modes_equal_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.inputs import Image, Text, Video, processor_batch

# (A Transformers release without Kimi-K2.5's packed tower helpers, e.g. 5.17: syncfree registers it not there.)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers.models.kimi_k25") is None
                                or "kimi_k25" not in syncfree.families.FAMILIES,
                                reason="this Transformers release has no Kimi-K2.5 syncfree supports")
NAME = "kimi-k25-tiny"


def _pair(attn: str = "sdpa", dtype=torch.float32):
    return model_pair(NAME, attn, dtype)


def _inputs(config, samples, padding_side="left"):
    from syncfree.families.kimi import build_kimi_inputs

    return build_kimi_inputs(config, samples, padding_side=padding_side)


# Pixels are multiples of 28 (patch 14 x merge 2). Video frames are cut into chunks of 4 (grid rows: t = 4, 4, 1 for 9
# frames), each one attention segment, pooled onto one frame's tokens.
LAYOUTS = standard_layouts(28) | {"a long video in chunks": [[Text(2), Video(9, 28, 56), Text(1), Image(56, 28)]]}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


def test_the_processor_layout_is_the_installed_processors():
    """Placeholders of an image and timestamps, markers and placeholders of a chunked video as the installed
    processor's own code writes them for our grids (its replace_*_token), the video processor's chunk size, no token
    types, 4D pixels."""
    import re

    from transformers.models.kimi_k25 import processing_kimi_k25 as processing

    from syncfree.families.kimi import CHUNK_FRAMES, markers

    source = open(importlib.util.find_spec("transformers.models.kimi_k25.video_processing_kimi_k25").origin,
                  encoding="utf-8").read()
    assert re.findall(r"^    temporal_patch_size = (\d+)$", source, re.M) == [str(CHUNK_FRAMES)]
    config = _pair()[0].config
    frames, fps, (height, width) = 9, 2.0, (56, 84)
    batch = _inputs(config, [[Image(width, height), Video(frames, height, width, fps=fps)]])
    assert batch["video_grid_thw"].tolist() == [[4, 4, 6], [4, 4, 6], [1, 4, 6]]
    assert batch["image_grid_thw"].tolist() == [[1, 6, 4]]
    assert batch["num_chunks_per_video"].tolist() == [3] and "mm_token_type_ids" not in batch
    assert batch["pixel_values"].shape == (24, 3, 14, 14) and batch["pixel_values_videos"].shape == (216, 3, 14, 14)
    units = SimpleNamespace(merge_size=2, temporal_patch_size=CHUNK_FRAMES)
    stub = SimpleNamespace(image_processor=units, video_processor=units, image_token="<img>", video_token="<vid>")
    metadata = SimpleNamespace(fps=fps, timestamps=[f / fps for f in range(frames)])
    text = (processing.Kimi_K25Processor.replace_image_token(stub, {"image_grid_thw": batch["image_grid_thw"]}, 0)
            + processing.Kimi_K25Processor.replace_video_token(
                stub, {"video_grid_thw": batch["video_grid_thw"], "video_metadata": [metadata],
                       "num_chunks_per_video": batch["num_chunks_per_video"].tolist()}, 0))
    begin, word, content, end = markers(config)
    names = {begin: "<|media_begin|>", word: "video", content: "<|media_content|>", end: "<|media_end|>",
             config.image_token_id: "<img>", config.video_token_id: "<vid>"}
    ours = re.sub("(<ts>)+", "<ts>", "".join(names.get(i, "<ts>") for i in batch["input_ids"][0].tolist()))
    theirs = re.sub(r"\d\d:\d\d:\d\d\.\d\d\d", "<ts>", text)
    assert ours == theirs and ours.count("<ts>") == 3


@settings(max_examples=60, deadline=None)
@given(grids=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 8).map(lambda n: 2 * n),
                                st.integers(1, 8).map(lambda n: 2 * n)), min_size=1, max_size=4))
def test_the_plans_segments_and_tables_are_stocks(grids):
    """One attention segment per clip, raster (row, col) ids, the bicubic taps, the frame index and the pooling
    triple, and h*w/4 features per row, as the tower's own calls of stock's helpers make them."""
    from transformers import vision_utils
    from transformers.models.kimi_k25 import modeling_kimi_k25 as modeling

    from syncfree.plan.spec import ModelSpec
    from syncfree.plan.vision import vision_plan
    from syncfree.plan.vision_tables import device_tables_match_stock

    stock = _pair()[0]
    tower = stock.model.vision_tower
    embed = tower.patch_embed.pos_emb
    grid = torch.tensor(grids)
    for spec in (ModelSpec.from_config(stock.config), ModelSpec.for_vision_model(tower)):
        plan = vision_plan(grid, spec)
        assert plan.tables_by_device and device_tables_match_stock(plan.tower_tables)
        cu_seqlens, max_seqlen = vision_utils.get_vision_attention_seqlens(grid, tower.config, merge_temporal=True)
        assert torch.equal(plan.cu_seqlens, cu_seqlens) and plan.max_seqlen == int(cu_seqlens.diff().max())
        kwargs = plan.vision_kwargs()
        want = vision_utils.get_vision_position_ids(grid, spatial_merge_size=1)
        assert kwargs["position_ids"].dtype == want.dtype and torch.equal(kwargs["position_ids"], want)
        taps = vision_utils.get_vision_interpolation_indices_and_weights(
            grid, embed.num_grid_per_side, mode=embed.interpolation_mode,
            align_corners=embed.interpolation_align_corners)
        assert embed.interpolation_mode == "bicubic" and taps[0].shape[1] == 16
        for got, w in zip((kwargs["interp_indices"], kwargs["interp_weights"]), taps):
            assert got.dtype == w.dtype and torch.equal(got, w)
        assert torch.equal(kwargs["frame_index"], modeling.get_vision_frame_index(grid))
        merged = modeling.get_vision_temporal_merge_index(grid, *tower.merge_kernel_size)
        got = kwargs["temporal_merge_index"]
        assert got[2] == merged[2] and all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got[:2], merged[:2]))
        assert plan.split_sizes == tuple((grid[:, 1:].prod(-1) // 4).tolist())


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_equals_stock_on_its_own_layouts(attn, layout, padding):
    stock, patched = _pair(attn)
    check_forward_equals_stock(stock, patched, _inputs(stock.config, LAYOUTS[layout], padding))


def test_the_towers_attention_weights_equal_stock():
    stock, patched = _pair("eager")
    batch = processor_batch(stock.config, LAYOUTS["a long video in chunks"])
    with torch.no_grad():
        want = stock.model.get_video_features(batch["pixel_values_videos"], batch["video_grid_thw"],
                                              output_attentions=True)
        got = patched.model.get_video_features(batch["pixel_values_videos"], batch["video_grid_thw"],
                                               output_attentions=True)
    assert len(got.attentions) == len(want.attentions) > 0
    assert all(torch.equal(a, b) for a, b in zip(got.attentions, want.attentions))
    assert all(torch.equal(a, b) for a, b in zip(got.pooler_output, want.pooler_output))


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    # (bf16: the experts' grouped matmul has no host read there; in fp32 it reads its group sizes, as in every MoE.)
    stock, patched = _pair(dtype=torch.bfloat16)
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["a long video in chunks"]
                            + LAYOUTS["padding and a text-only row"][2:])
    batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


@pytest.mark.parametrize("layout", ["videos"])  # (images: the conformance suite)
def test_generate_and_backward_equal_stock_over_frame_chunks(layout):
    stock, patched = _pair()
    samples = ([[Text(2), Image(112, 56), Text(2), Image(56, 56), Text(1)], [Text(1), Image(56, 56), Text(2)]]
               if layout == "images" else [[Text(2), Video(6, 56, 56), Text(1)], [Text(1), Video(1, 56, 84), Text(2)]])
    # (Stock generate() refuses the processor's num_chunks_per_video, which no forward reads: left out, as a user must.)
    batch = {k: v for k, v in _inputs(stock.config, samples).items() if k != "num_chunks_per_video"}
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    check_generate_modes_equal_stock(stock, patched, batch, options)


def test_patched_vision_tower_compiles_without_graph_breaks():
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(84, 112), Image(56, 28)]])
    explained = tower_graph_breaks(patched, patched.model.vision_tower, batch)
    assert explained.graph_break_count == 0

