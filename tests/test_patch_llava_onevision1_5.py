"""LLaVA-OneVision-1.5: RiceViT (2D axial rotary ids, a class token prepended to every frame) and Qwen3's text model,
without 3D positions. The processor's layout (against the installed processor's own code), the plan's segments,
frame lengths and rotary ids against stock's helpers on drawn grids, the tower and the whole forward equal to stock
over the processor's layouts (both paddings, eager and SDPA), every attention backend, no syncs and no blocking copies
with prepare(), generate (dynamic, static and beams), gradients, vision_every_step, compile, stock's placeholder
error, and compile_vision's refusal."""

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
    check_attention_backend_equals_stock,
    check_forward_equals_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    check_vision_every_step,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.inputs import Image, Text, Video, build_inputs, processor_batch

# (A Transformers release without LLaVA-OneVision-1.5, e.g. 5.24: syncfree registers it not there.)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers.models.llava_onevision1_5") is None
                                or "llava_onevision1_5" not in syncfree.families.FAMILIES,
                                reason="this Transformers release has no LLaVA-OneVision-1.5 syncfree supports")
NAME = "llava-ov-1.5-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


# Pixels are multiples of 28 (patch 14 x merge 2); a video has one grid frame per sampled frame (no temporal patches),
# each its own attention segment with its own class token.
LAYOUTS = standard_layouts(28) | {
    "touching images and a long video": [[Text(2), Image(28, 56), Image(56, 28), Text(1), Video(7, 28, 28), Text(1)]],
}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


def test_the_processor_layout_is_the_installed_processors():
    """Each image as its placeholders (the installed processor's own replace_*_token for our grids) between the
    config's vision start and end ids, a video as one run of t*h*w/4, no token types, one 3x14x14 frame per patch."""
    from transformers.models.exaone4_5.processing_exaone4_5 import Exaone4_5_Processor
    from transformers.models.llava_onevision1_5 import modeling_llava_onevision1_5 as modeling

    config = _pair()[0].config
    assert not hasattr(config.vision_config, "temporal_patch_size")  # (the processors' frames: one per grid step)
    batch = processor_batch(config, [[Text(2), Image(84, 56), Text(1), Video(3, 28, 56), Text(2)]])
    assert "mm_token_type_ids" not in batch
    assert batch["image_grid_thw"].tolist() == [[1, 6, 4]] and batch["video_grid_thw"].tolist() == [[3, 2, 4]]
    assert batch["pixel_values"].shape == (24, 3 * 14 * 14) and batch["pixel_values_videos"].shape == (24, 3 * 14 * 14)
    stub = SimpleNamespace(image_processor=SimpleNamespace(merge_size=2), video_processor=SimpleNamespace(merge_size=2),
                           image_token="<img>", video_token="<vid>")
    text = (Exaone4_5_Processor.replace_image_token(stub, {"image_grid_thw": batch["image_grid_thw"]}, 0) + "|"
            + Exaone4_5_Processor.replace_video_token(stub, {"video_grid_thw": batch["video_grid_thw"]}, 0))
    names = {config.image_token_id: "<img>", config.video_token_id: "<vid>", config.vision_start_token_id: "<s>",
             config.vision_end_token_id: "<e>"}
    ours = "".join(names.get(i, "t") for i in batch["input_ids"][0].tolist())
    assert ours == "tt<s>" + text.replace("|", "<e>t<s>") + "<e>tt"
    # The tower embeds each row as one (3, 14, 14) patch: the pixels' rows are the grid's patches.
    assert "hidden_states.view(-1, self.in_channels, self.patch_size, self.patch_size)" in \
        open(modeling.__file__, encoding="utf-8").read()


grids = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 6).map(lambda n: 2 * n),
                           st.integers(1, 6).map(lambda n: 2 * n)), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(grid=grids)
def test_the_plans_segments_frame_lengths_and_rotary_ids_are_stocks(grid):
    """Per-frame cu_seqlens and max_seqlen, the (row, col) rotary ids, the frame lengths (stock's
    get_vision_frame_lengths) and the attention's split sizes: one class token longer than each frame, the segments
    of stock's shifted cu_seqlens; h*w*t/4 features per row."""
    from transformers import vision_utils
    from transformers.models.llava_onevision1_5 import modeling_llava_onevision1_5 as modeling

    from syncfree.plan.spec import ModelSpec
    from syncfree.plan.vision import vision_plan

    stock = _pair()[0]
    grid_thw = torch.tensor(grid)
    for spec in (ModelSpec.from_config(stock.config), ModelSpec.for_vision_model(stock.model.visual)):
        plan = vision_plan(grid_thw, spec)
        cu_seqlens, _ = vision_utils.get_vision_attention_seqlens(grid_thw, stock.model.visual.config)
        assert plan.cu_seqlens.dtype == cu_seqlens.dtype and torch.equal(plan.cu_seqlens, cu_seqlens)
        assert plan.max_seqlen == int(cu_seqlens.diff().max())
        kwargs = plan.vision_kwargs()
        want = vision_utils.get_vision_position_ids(grid_thw, 2)
        assert kwargs["position_ids"].dtype == want.dtype and torch.equal(kwargs["position_ids"], want)
        assert kwargs["frame_lengths"] == modeling.get_vision_frame_lengths(grid_thw)
        shifted = cu_seqlens + torch.arange(cu_seqlens.shape[0], dtype=cu_seqlens.dtype)  # (the tower's own shift)
        assert list(kwargs["syncfree_seqlens"][shifted.shape[0]]) == shifted.diff().tolist()
        assert plan.split_sizes == tuple((grid_thw.prod(-1) // 4).tolist())


@settings(max_examples=20, deadline=None)
@given(grid=grids)
def test_the_tower_equals_stock_on_drawn_grids(grid):
    from syncfree.plan.spec import ModelSpec
    from syncfree.plan.vision import vision_plan

    stock, patched = _pair()
    grid_thw = torch.tensor(grid)
    pixels = torch.randn(int(grid_thw.prod(-1).sum()), 3 * 14 * 14)
    plan = vision_plan(grid_thw, ModelSpec.from_config(patched.config))
    with torch.no_grad():
        want = stock.model.visual(pixels, grid_thw=grid_thw)
        for got in (patched.model.visual(pixels, grid_thw=grid_thw),
                    patched.model.visual(pixels, grid_thw=grid_thw, syncfree_vision_plan=plan)):
            assert torch.equal(got.pooler_output, want.pooler_output)
            assert torch.equal(got.last_hidden_state, want.last_hidden_state)


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_equals_stock_on_its_own_layouts(attn, layout, padding):
    stock, patched = _pair(attn)
    check_forward_equals_stock(stock, patched, build_inputs(stock.config, LAYOUTS[layout], padding_side=padding))


def test_a_row_of_padding_only_runs_as_stock_runs_it():
    """Without 3D positions stock takes a row whose mask is all zeros (no error): prepare() accepts it too."""
    stock, patched = _pair()
    batch = processor_batch(stock.config, [[Text(2), Image(56, 56), Text(2)], [Text(3)]])
    batch["attention_mask"][1] = 0
    with torch.no_grad():
        expected = stock(**batch).logits
        assert torch.equal(patched(**batch).logits, expected)
        assert torch.equal(patched(**syncfree.prepare(batch, None, patched)).logits, expected)


def test_the_towers_hidden_states_and_attention_weights_equal_stock():
    """Per block, with the class tokens: eager attention returns each segment's weights (one token longer)."""
    stock, patched = _pair("eager")
    batch = processor_batch(stock.config, LAYOUTS["image and videos"])
    with torch.no_grad():
        want = stock.model.get_video_features(batch["pixel_values_videos"], batch["video_grid_thw"],
                                              output_attentions=True, output_hidden_states=True)
        got = patched.model.get_video_features(batch["pixel_values_videos"], batch["video_grid_thw"],
                                               output_attentions=True, output_hidden_states=True)
    assert len(got.attentions) == len(want.attentions) > 0
    assert all(torch.equal(a, b) for a, b in zip(got.attentions, want.attentions))
    assert all(torch.equal(a, b) for a, b in zip(got.hidden_states, want.hidden_states))
    assert all(torch.equal(a, b) for a, b in zip(got.pooler_output, want.pooler_output))


@pytest.mark.parametrize("backend", ["grouped", "block_diagonal", "auto"])
def test_every_attention_backend_attends_within_each_frame_and_its_class_token(backend):
    grid = torch.tensor([[1, 4, 4], [1, 4, 4], [3, 2, 4], [1, 2, 2]])
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 14 * 14, generator=torch.Generator().manual_seed(0))
    check_attention_backend_equals_stock(_pair()[0].model.visual, grid, pixels, backend)


def test_prepared_prefill_has_no_sync_and_no_blocking_copy_and_moved_inputs_one_sync():
    stock, patched = _pair()
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["touching images and a long video"]
                            + LAYOUTS["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch, use_cache=True)


@pytest.mark.parametrize("layout", ["text-only", "image"])
def test_vision_every_step_makes_both_tower_passes_with_stock_numbers(layout):
    """A tower without temporal patches takes the one-unit dummy pass too (one 3x14x14 patch per row)."""
    from syncfree.compare.train import labels_for

    samples = {"text-only": [[Text(9)], [Text(5)]], "image": [[Text(2), Image(56, 56), Text(3)]]}[layout]
    batch = processor_batch(_pair()[0].config, samples)
    batch["labels"] = labels_for(batch)
    check_vision_every_step(NAME, batch)


def test_patched_vision_tower_compiles_without_graph_breaks():
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(84, 112), Image(56, 28)]])
    assert tower_graph_breaks(patched, patched.model.visual, batch).graph_break_count == 0


def test_compile_vision_refuses_the_tower_with_a_class_token_per_frame():
    from syncfree.presets import build_model

    with pytest.raises(ValueError, match="compile_vision does not support LlavaOnevision15VisionModel yet .*class "
                                         "token to each frame"):
        syncfree.compile_vision(build_model(NAME), compile=False)

