"""MiniMax-M3-VL: a tower attending over each clip as one segment with (t, h, w) rotary ids, a projector after it, and a
MoE text model with block-sparse indexer layers, without 3D positions. The processor's layout (checked against the
installed processor's own code), the plan's tables against stock's helpers, parity with stock over the processor's
layouts (the tower's attention weights too), no syncs and no blocking copies with prepare() (bf16), generate
(dynamic, static and beams), gradients, compile, stock's placeholder error, vision_every_step refused."""

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
from syncfree.presets import build_model

# (Transformers 5.17 has an older MiniMax-M3-VL, without the packed tower's helpers: syncfree registers it not there.)
pytestmark = pytest.mark.skipif("minimax_m3_vl" not in syncfree.families.FAMILIES,
                                reason="this Transformers release has no MiniMax-M3-VL syncfree supports")
NAME = "minimax-m3-vl-tiny"
MODULE = "transformers.models.minimax_m3_vl.modeling_minimax_m3_vl"


def _pair(attn: str = "sdpa", dtype=torch.float32):
    return model_pair(NAME, attn, dtype)


def _inputs(config, samples, padding_side="left"):
    from syncfree.families.minimax import build_minimax_inputs

    return build_minimax_inputs(config, samples, padding_side=padding_side)


# Pixels are multiples of 28 (patch 14 x merge 2). A video of more than 4 temporal patches is cut into grid rows of
# at most 4 (each its own attention segment), as the video processor cuts it.
LAYOUTS = standard_layouts(28) | {"a long video in chunks": [[Text(2), Video(18, 28, 56), Text(1), Image(56, 28)]]}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


def test_the_processor_layout_is_the_installed_processors():
    """Markers, placeholders and timestamps of an image and of a chunked video as the installed processor's own code
    writes them for our grids (its replace_*_token), the video processor's chunk size, no token types. (The image and
    video processors themselves need torchvision: their chunk size is read from their source.)"""
    import re

    from transformers.models.minimax_m3_vl import processing_minimax_m3_vl as processing

    from syncfree.families.minimax import CHUNK_FRAMES, markers

    source = open(importlib.util.find_spec("transformers.models.minimax_m3_vl.video_processing_minimax_m3_vl").origin,
                  encoding="utf-8").read()
    assert re.findall(r"^    vision_segment_max_frames = (\d+)$", source, re.M) == [str(CHUNK_FRAMES)]
    config = _pair()[0].config
    cls = processing.MiniMaxM3VLProcessor
    frames, fps, (height, width) = 18, 2.0, (56, 84)
    batch = _inputs(config, [[Image(width, height), Video(frames, height, width, fps=fps)]])
    assert batch["video_grid_thw"].tolist() == [[4, 4, 6], [4, 4, 6], [1, 4, 6]]
    assert batch["num_chunks_per_video"].tolist() == [3] and "mm_token_type_ids" not in batch
    units = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    stub = SimpleNamespace(image_processor=units, video_processor=units, **{
        k: getattr(cls, k) for k in ("IMAGE_TOKEN", "VIDEO_TOKEN", "VISION_START_TOKEN", "VISION_END_TOKEN")})
    metadata = SimpleNamespace(fps=fps, frames_indices=list(range(frames)))
    text = (cls.replace_image_token(stub, {"image_grid_thw": batch["image_grid_thw"]}, 0)
            + cls.replace_video_token(stub, {"video_grid_thw": batch["video_grid_thw"], "video_metadata": [metadata],
                                             "num_chunks_per_video": batch["num_chunks_per_video"].tolist()}, 0))
    # Our ids as the processor's text: markers and placeholders by name, each timestamp's text tokens as one "<ts>".
    start, end = markers(config)
    names = {start: cls.VISION_START_TOKEN, end: cls.VISION_END_TOKEN, config.image_token_id: cls.IMAGE_TOKEN,
             config.video_token_id: cls.VIDEO_TOKEN}
    ours = re.sub("(<ts>)+", "<ts>", "".join(names.get(i, "<ts>") for i in batch["input_ids"][0].tolist()))
    theirs = re.sub(r"\]<\]\d+\.\d seconds\[>\[", "<ts>", text)
    assert ours == theirs and ours.count("<ts>") == frames // 2


@settings(max_examples=60, deadline=None)
@given(grids=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 8).map(lambda n: 2 * n),
                                st.integers(1, 8).map(lambda n: 2 * n)), min_size=1, max_size=4))
def test_the_plans_segments_and_tables_are_stocks(grids):
    """One attention segment per clip and (t, row, col) ids, as the tower's own calls of stock's helpers make them."""
    from transformers import vision_utils

    from syncfree.plan.spec import ModelSpec
    from syncfree.plan.vision import vision_plan
    from syncfree.plan.vision_tables import device_tables_match_stock

    stock = _pair()[0]
    tower = stock.model.vision_tower
    assert tower.merge_temporal and tower.include_temporal  # the flags the plan's layout stands for
    grid = torch.tensor(grids)
    plan = vision_plan(grid, ModelSpec.from_config(stock.config))
    assert plan.tables_by_device and device_tables_match_stock(plan.tower_tables)
    cu_seqlens, max_seqlen = vision_utils.get_vision_attention_seqlens(grid, tower.config, merge_temporal=True)
    assert torch.equal(plan.cu_seqlens, cu_seqlens) and plan.max_seqlen == int(cu_seqlens.diff().max())
    want = vision_utils.get_vision_position_ids(grid, 2, include_temporal=True)
    assert plan.position_ids.dtype == want.dtype and torch.equal(plan.position_ids, want)
    assert plan.split_sizes == tuple((grid.prod(-1) // 4).tolist())


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
    for g, w in zip(got.attentions, want.attentions):
        assert len(g) == len(w) == 3 and all(torch.equal(a, b) for a, b in zip(g, w))  # one segment per chunk (4, 4, 1)


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
               if layout == "images" else [[Text(2), Video(10, 56, 56), Text(1)], [Text(1), Video(2, 56, 84), Text(2)]])
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


@pytest.mark.parametrize("attention", ["split", None])
def test_compile_visions_padded_buckets_keep_the_towers_output(attention):
    """The tower keeps a batch dim of 1 around its packed patches: the bucket's padding rows are cut from dim 1.
    ``split`` is bit-identical to stock; the default (one block-diagonal call) equal to rounding."""
    stock = _pair()[0]
    patched = syncfree.compile_vision(syncfree.patch(build_model(NAME)), buckets=(256, 512), compile=False,
                                      attention=attention)
    batch = processor_batch(stock.config, LAYOUTS["a long video in chunks"])
    with torch.no_grad():
        want = stock.model.get_video_features(batch["pixel_values_videos"], batch["video_grid_thw"])
        got = patched.model.get_video_features(batch["pixel_values_videos"], batch["video_grid_thw"])
    assert got.last_hidden_state.shape == want.last_hidden_state.shape
    if attention == "split":
        assert torch.equal(got.last_hidden_state, want.last_hidden_state)
    else:
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)


@pytest.mark.usefixtures("fresh_dynamo")
def test_the_indexers_block_mask_is_stocks_with_one_graph_for_texts_of_one_key_block_and_more():
    """The indexer keeps ``min(topk_blocks, key blocks)`` blocks: one for a text of one block. A traced forward keeps
    ``topk_blocks`` slots (``top_blocks``), so one graph serves texts of one block and longer (stock's width guards on
    being 1 in the ``masked_fill`` after it), with the block mask stock's indexer gives, eager and traced."""
    from torch._dynamo.testing import CompileCounter

    # (models of its own: a compiled graph keeps references to the parameters it traced, which the session's shared
    # pair must not have when later tests move it to another device)
    stock, patched = build_model(NAME), syncfree.patch(build_model(NAME))
    [theirs] = [m for m in stock.modules() if type(m).__name__ == "MiniMaxM3VLIndexer"]
    [ours] = [m for m in patched.modules() if type(m).__name__ == "MiniMaxM3VLIndexer"]
    rotary = patched.model.language_model.rotary_emb

    def block_mask(indexer, hidden, position_ids):
        kept = indexer(hidden, rotary(hidden, position_ids), None, position_ids)
        return indexer.build_block_mask(kept, None, hidden.shape[1], hidden.dtype, hidden.device, position_ids)

    counter = CompileCounter()
    compiled = torch.compile(lambda h, p: block_mask(ours, h, p), fullgraph=True, dynamic=True, backend=counter)
    generator = torch.Generator().manual_seed(0)
    block = ours.block_size
    # (one block, then more blocks than the top k, then fewer; no length a model size shares: duck sizing)
    for length in (block - 3, 3 * block + 5, block - 5, block + 5, 4 * block - 1):
        hidden = torch.randn(2, length, patched.config.text_config.hidden_size, generator=generator)
        position_ids = torch.arange(length).expand(2, -1)
        with torch.no_grad():
            want = block_mask(theirs, hidden, position_ids)
            assert torch.equal(block_mask(ours, hidden, position_ids), want)
            assert torch.equal(compiled(hidden, position_ids), want), length
    assert counter.frame_count == 1
