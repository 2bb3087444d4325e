"""Ovis2.5: a windowed SigLIP2 NaViT tower (window and full layers) with a bicubically resampled learned table, a visual
tokenizer outside it, Qwen3's text model without 3D positions, and boundary tokens around each image or video that the
forward counts and replaces by indicator embeddings.

The layout against the installed processor's own code, the plan's tables against stock's helpers on drawn grids,
parity with stock over the processor's layouts (left and right padding, images of different sizes, videos), no syncs
and no blocking copies with prepare(), generate (dynamic, static and beams), gradients, compile, the tower called on
its own, the errors stock raises for miscounted placeholders or boundary tokens, and inputs_embeds.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_attention_backend_equals_stock,
    check_forward_equals_stock,
    check_placeholder_mismatch_raises_stocks_error,
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.inputs import Image, Text, Video, processor_batch

pytestmark = pytest.mark.skipif("ovis2_5" not in syncfree.families.FAMILIES,
                                reason="this Transformers release has no Ovis2.5")
NAME = "ovis2.5-tiny"
MODULE = "transformers.models.ovis2_5.modeling_ovis2_5"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


def _build(config, samples, padding_side="left"):
    from syncfree.families.ovis2_5 import build_ovis_inputs

    return build_ovis_inputs(config, samples, padding_side=padding_side)


# Pixels are multiples of 32 (patch 16 x merge 2); the tiny tower's windows are 112 px (3x3 merged patches), so the
# larger images and video frames have several, some cut by the edge.
LAYOUTS = standard_layouts(32) | {
    "windows cut by the edge": [[Text(2), Image(7 * 32, 4 * 32), Text(1), Video(2, 5 * 32, 3 * 32), Text(1)],
                                [Text(1), Image(3 * 32, 6 * 32), Text(2)]],
}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


# ---- the processor's layout ------------------------------------------------------------------------------------------
_TOKENS = {"image_token": "<image>", "video_token": "<video>", "image_start_token": "<img_start>",
           "image_end_token": "<img_end>", "video_start_token": "<vid_start>", "video_end_token": "<vid_end>"}


def _tokens_by_id(config) -> dict[int, str]:
    """The processor's special tokens by the tiny config's ids."""
    from syncfree.families.ovis2_5 import boundary_ids

    ids = {config.image_token_id: "<image>", config.video_token_id: "<video>"}
    ids.update({v: _TOKENS[f"{k}_token"] for k, v in boundary_ids(config).items()})
    assert len(ids) == 6 and max(ids) < config.text_config.vocab_size
    return ids


def _processor(config, temporal_patch_size: int = 1):
    """The installed ``Ovis2_5Processor`` with its image processor (PIL) and a word-level tokenizer whose special tokens
    sit at the tiny config's ids (``w<i>`` is text token i). Without torchvision there is no video processor, whose
    class the processor's constructor checks: that check is skipped for a missing one alone."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.ovis2_5 import Ovis2_5ImageProcessorPil, Ovis2_5Processor

    class ImageOnly(Ovis2_5Processor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument is None and argument_name == "video_processor":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    specials = {token: i for i, token in _tokens_by_id(config).items()}
    vocab = {f"w{i}": i for i in range(1, min(specials.values()))} | specials | {"<pad>": 0}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", extra_special_tokens=_TOKENS)
    images = Ovis2_5ImageProcessorPil(size={"shortest_edge": 32 * 32, "longest_edge": 512 * 512},
                                      temporal_patch_size=temporal_patch_size)
    return ImageOnly(image_processor=images, tokenizer=tokenizer, video_processor=None)


def _picture(height: int, width: int, seed: int):
    import numpy as np
    from PIL import Image as PILImage

    return PILImage.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


def test_the_layout_is_the_installed_processors_own_text():
    """An image and a video written by the installed processor's replace_image_token / replace_video_token for our
    grids: each between its own boundary tokens, a video's frames in one run; no token types."""
    from transformers.models.ovis2_5.processing_ovis2_5 import Ovis2_5Processor

    config = _pair()[0].config
    batch = _build(config, [[Text(2), Image(96, 64), Text(1), Video(3, 64, 128), Text(1)]])
    assert "mm_token_type_ids" not in batch
    assert batch["image_grid_thw"].tolist() == [[1, 6, 4]] and batch["video_grid_thw"].tolist() == [[3, 4, 8]]
    units = SimpleNamespace(merge_size=config.vision_config.spatial_merge_size)
    stub = SimpleNamespace(image_processor=units, video_processor=units, **_TOKENS)
    theirs = (Ovis2_5Processor.replace_image_token(stub, {"image_grid_thw": batch["image_grid_thw"]}, 0)
              + Ovis2_5Processor.replace_video_token(stub, {"video_grid_thw": batch["video_grid_thw"]}, 0))
    names = _tokens_by_id(config)
    ours = "".join(names.get(i, "") for i in batch["input_ids"][0].tolist())
    assert ours == theirs and ours.count("<image>") == 6 and ours.count("<video>") == 3 * 8


@pytest.mark.parametrize("padding", ["left", "right"])
def test_an_image_batch_is_the_installed_processors(padding):
    """Two rows with images of different sizes through the installed processor: the same token layout (every special
    token and pad where ours are), mask, grids and pixel shape."""
    config = _pair()[0].config
    processor = _processor(config)
    theirs = processor(text=["w5 w6 <image> w7 <image>", "w8 <image> w9"],
                       images=[_picture(96, 64, 0), _picture(32, 96, 1), _picture(64, 64, 2)], padding=True,
                       padding_side=padding, return_tensors="pt")
    ours = _build(config, [[Text(2), Image(96, 64), Text(1), Image(32, 96)], [Text(1), Image(64, 64), Text(1)]],
                  padding_side=padding)
    assert set(ours) == set(theirs)
    text = (theirs["input_ids"] > 0) & (theirs["input_ids"] < config.image_token_id)
    assert torch.equal(ours["input_ids"].masked_fill(text, -1), theirs["input_ids"].masked_fill(text, -1))
    assert torch.equal(ours["attention_mask"], theirs["attention_mask"])
    assert torch.equal(ours["image_grid_thw"], theirs["image_grid_thw"])
    assert ours["pixel_values"].shape == theirs["pixel_values"].shape
    assert ours["pixel_values"].dtype == theirs["pixel_values"].dtype


def test_an_images_pixels_repeat_over_the_temporal_patch_as_the_image_processor_writes_them():
    """Each patch holds (channel, temporal, row, column) values: with a temporal patch of 2 the image processor repeats
    each channel's block, and so does the batch builder."""
    config = copy.deepcopy(_pair()[0].config)
    config.vision_config.temporal_patch_size = 2
    theirs = _processor(config, temporal_patch_size=2)(
        text=["<image>"], images=[_picture(64, 96, 3)], return_tensors="pt")["pixel_values"]
    ours = _build(config, [[Image(64, 96)]])["pixel_values"]
    assert ours.shape == theirs.shape == (4 * 6, 3 * 2 * 16 * 16)
    for pixels in (ours, theirs):
        blocks = pixels.view(-1, 3, 2, 16 * 16)
        assert torch.equal(blocks[:, :, 0], blocks[:, :, 1]) and not torch.equal(blocks[:, 0], blocks[:, 1])


# ---- the plan's tables -----------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=4),
       window=st.sampled_from([64, 96, 112, 512]), side=st.sampled_from([4, 8, 32]))
def test_the_planned_tables_equal_stocks_helpers(rows, window, side):
    """Rotary ids, bicubic taps (spatial-merge order, no aligned corners) and the window order the plan makes on the
    device are what stock's helpers give for the same grid."""
    from syncfree.plan.traits import PositionTable
    from syncfree.plan.vision_tables import TowerTables, host_tables, tables_from_grid

    grid = torch.tensor([(t, 2 * h, 2 * w) for t, h, w in rows], dtype=torch.long)
    spec = TowerTables(MODULE, 2, side, window, 16, align_corners=False, table=PositionTable(mode="bicubic"))
    ours, stock = tables_from_grid(grid, spec), host_tables(grid, spec)
    assert ours.keys() == stock.keys() == {"position_ids", "interp_indices", "interp_weights", "window_index"}
    assert all(ours[k].dtype == v.dtype and torch.equal(ours[k], v) for k, v in stock.items())


def test_the_plan_is_what_the_tower_computes():
    """The tower's own helpers on a batch's grid give the plan's segments, windows, ids and taps; both plans (from
    the config, from the tower alone) make their tables on the device."""
    from transformers import vision_utils

    from syncfree.plan.spec import ModelSpec
    from syncfree.plan.vision import vision_plan

    stock = _pair()[0]
    tower = stock.model.vision_tower
    grid = _build(stock.config, LAYOUTS["windows cut by the edge"])["image_grid_thw"]
    embed = tower.embeddings
    for spec in (ModelSpec.from_config(stock.config), ModelSpec.for_vision_model(tower)):
        plan = vision_plan(grid, spec)
        assert plan.tables_by_device and len(plan.window_seqlens) > len(plan.seqlens)
        kwargs = plan.vision_kwargs()
        cu_seqlens, _ = vision_utils.get_vision_attention_seqlens(grid, tower.config)
        window_index, cu_windows = vision_utils.get_vision_window_index(grid, tower.spatial_merge_size,
                                                                        tower.window_size, tower.patch_size)
        taps = vision_utils.get_vision_interpolation_indices_and_weights(
            grid, embed.num_grid_per_side, mode=embed.interpolation_mode,
            align_corners=embed.interpolation_align_corners, spatial_merge_size=embed.spatial_merge_size)
        wants = {"cu_seqlens": cu_seqlens, "window_index": window_index, "cu_window_seqlens": cu_windows,
                 "position_ids": vision_utils.get_vision_position_ids(grid, tower.spatial_merge_size),
                 "interp_indices": taps[0], "interp_weights": taps[1]}
        for name, want in wants.items():
            assert kwargs[name].dtype == want.dtype and torch.equal(kwargs[name], want), name
        assert plan.split_sizes == tuple((grid.prod(-1) // 4).tolist())


# ---- parity with stock -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_equals_stock_on_its_own_layouts(attn, layout, padding):
    stock, patched = _pair(attn)
    check_forward_equals_stock(stock, patched, _build(stock.config, LAYOUTS[layout], padding))


def test_the_visual_outputs_and_the_towers_attention_weights_equal_stock():
    """Each image's and video's features, and every tower layer's per-segment weights (window and full layers)."""
    stock, patched = _pair("eager")
    batch = _build(stock.config, LAYOUTS["windows cut by the edge"])
    with torch.no_grad():
        want = stock(**batch, output_attentions=True)
        for inputs in (batch, syncfree.prepare(batch, None, patched)):
            got = patched(**inputs, output_attentions=True)
            assert torch.equal(got.logits, want.logits)
            for kind in ("image_outputs", "video_outputs"):
                g, w = getattr(got, kind), getattr(want, kind)
                assert len(g.pooler_output) == len(w.pooler_output) > 0
                assert all(torch.equal(a, b) for a, b in zip(g.pooler_output, w.pooler_output))
                assert len(g.attentions) == len(w.attentions) == 3
                for a, b in zip(g.attentions, w.attentions):  # (a list of segments' weights per layer)
                    assert len(a) == len(b) > 1 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_token_types_passed_too_equal_stock():
    """The processor returns ``mm_token_type_ids`` when asked (images 1, videos 2): the forward takes and ignores them."""
    stock, patched = _pair()
    batch = _build(stock.config, LAYOUTS["image and videos"])
    ids = batch["input_ids"]
    batch["mm_token_type_ids"] = ((ids == stock.config.image_token_id).long()
                                  + 2 * (ids == stock.config.video_token_id).long())
    check_forward_equals_stock(stock, patched, batch)


def test_inputs_embeds_equal_stock():
    """Without input_ids stock finds placeholders and boundary tokens by their embeddings: so does the patched model."""
    stock, patched = _pair()
    batch = _build(stock.config, LAYOUTS["one image"])
    ids = batch.pop("input_ids")
    with torch.no_grad():
        embeds = stock.get_input_embeddings()(ids)
        want = stock(**batch, inputs_embeds=embeds).logits
        assert torch.equal(patched(**batch, inputs_embeds=embeds).logits, want)


def test_the_tower_called_alone_equals_stock_with_one_read():
    """get_image_features on device tensors without a plan: stock's features, after one read of the grid in the tower
    (its tables, the learned table's taps included, made on the device) and stock's own split outside it."""
    from syncfree.audit import audit, emulate_cuda

    stock, patched = _pair()
    batch = _build(stock.config, LAYOUTS["images of different sizes"])
    with torch.no_grad():
        want = stock.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"]).pooler_output
        with emulate_cuda():
            patched.to("cuda")
            try:
                pixels, grid = batch["pixel_values"].to("cuda"), batch["image_grid_thw"].to("cuda")
                with audit() as report:
                    got = patched.model.get_image_features(pixels, grid).pooler_output
                got = [g.cpu() for g in got]
            finally:
                patched.to("cpu")
    assert len(got) == len(want) == 3 and all(torch.equal(g, w) for g, w in zip(got, want))
    where = sorted(event.stack[0].function for event in report.syncs)
    assert where == ["get_image_features", "read_to_host_syncs_once"] and not report.blocking_copies


@pytest.mark.parametrize("backend", ["grouped", "block_diagonal", "auto"])
def test_every_attention_backend_attends_within_each_window_and_frame(backend):
    grid = torch.tensor([[1, 8, 6], [2, 4, 4], [1, 2, 10]])
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 16 * 16, generator=torch.Generator().manual_seed(0))
    check_attention_backend_equals_stock(_pair()[0].model.vision_tower, grid, pixels, backend, "last_hidden_state")


def test_prepared_prefill_has_no_sync_and_no_blocking_copy():
    stock, patched = _pair()
    batch = _build(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


def test_the_patched_tower_compiles_without_a_graph_break():
    """With the plan's tables handed over, the tower reads nothing of its grid on the device: one graph."""
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(128, 96), Image(64, 32)]])
    explained = tower_graph_breaks(patched, patched.model.vision_tower, batch)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]


@pytest.mark.parametrize("attention", ["split", None])
def test_the_bucketed_tower_equals_stock(attention):
    """compile_vision's padded buckets (run eagerly): the tower's features for the real patches, exactly with stock's
    split and to rounding with the default block-diagonal attention (the tower returns no merged output)."""
    stock = _pair()[0].model.vision_tower
    tower = syncfree.compile_vision(syncfree.patch(copy.deepcopy(stock)), buckets=(64, 128, 256), compile=False,
                                    attention=attention)
    for grid in ([[2, 4, 6], [1, 8, 8]], [[1, 6, 10]], [[3, 2, 2]]):
        grid = torch.tensor(grid)
        pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 16 * 16, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            want, got = stock(pixels, grid_thw=grid), tower(pixels, grid_thw=grid)
        assert got.pooler_output is None and got.last_hidden_state.shape == want.last_hidden_state.shape
        if attention == "split":
            assert torch.equal(got.last_hidden_state, want.last_hidden_state)
        else:
            torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-5, rtol=0)


# ---- stock's errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edge", ["start", "end"])
def test_a_missing_boundary_token_raises_stocks_error(edge):
    """One image lost its start (or end) token: stock's count check fails, with stock's message, patched too."""
    from syncfree.families.ovis2_5 import boundary_ids

    stock, patched = _pair()
    batch = _build(stock.config, [[Text(2), Image(64, 64), Text(1), Image(32, 64), Text(1)]])
    token = boundary_ids(stock.config)[f"image_{edge}"]
    ids = batch["input_ids"].clone()
    first = int((ids[0] == token).nonzero()[0])
    ids[0, first] = 7
    batch["input_ids"] = ids
    errors = []
    for model, prepared in ((stock, False), (patched, False), (patched, True)):  # (prepare() accepts the batch)
        with pytest.raises(ValueError) as raised, torch.no_grad():
            model(**(syncfree.prepare(batch, None, patched) if prepared else batch))
        errors.append(str(raised.value))
    assert errors == [f"Expected 2 visual boundary tokens with id {token}, but found 1."] * 3


def test_a_placeholder_count_mismatch_raises_stocks_error():
    """Stock's error from the patched model; prepare() says it with stock's words, the grids after them."""
    stock, patched = _pair()
    batch = _build(stock.config, [[Text(3), Image(64, 96), Text(2)]])
    check_placeholder_mismatch_raises_stocks_error(stock, patched, batch)
    ids = batch["input_ids"].clone()
    ids[ids == stock.config.image_token_id] = torch.tensor([stock.config.image_token_id] * 5 + [5])
    with pytest.raises(ValueError, match=r"^Image features and image tokens do not match, tokens: 5, features: 6 "):
        syncfree.prepare({**batch, "input_ids": ids}, None, patched)



@pytest.mark.parametrize("kind", ["image", "video"])
def test_prepare_refuses_a_missing_boundary_token_with_stocks_error(kind):
    """prepare() checks the boundary counts against the grids as stock's forward does (its type, its words), so a
    compiled forward never traces a batch whose check would fail inside Dynamo, under Dynamo's own words."""
    from syncfree.families.ovis2_5 import boundary_ids

    _, patched = _pair()
    item = Image(64, 64) if kind == "image" else Video(2, 64, 64)
    batch = _build(patched.config, [[Text(2), item, Text(1)], [Text(1), item, Text(1)]])
    token = boundary_ids(patched.config)[f"{kind}_end"]
    ids = batch["input_ids"].clone()
    ids[1, int((ids[1] == token).nonzero()[0])] = 7
    batch["input_ids"] = ids
    with pytest.raises(ValueError) as raised:
        syncfree.prepare(batch, None, patched)
    assert str(raised.value) == f"Expected 2 visual boundary tokens with id {token}, but found 1."


# ---- torch.compile ---------------------------------------------------------------------------------------------------
def test_a_patched_instance_records_its_towers_hidden_states_before_its_first_call():
    """get_image_features asks the tower for its hidden states on every call; Transformers installs the recording hooks
    at the first such call, under a lock a traced forward cannot take: a patched instance has them already (a stock
    model gets them at its first call, as before), so its first call may be compiled whole."""
    from syncfree.presets import build_model

    stock, patched = build_model(NAME), syncfree.patch(build_model(NAME))
    assert getattr(patched.model.vision_tower, "_output_capturing_hooks_installed", False)
    assert not getattr(stock.model.vision_tower, "_output_capturing_hooks_installed", False)
    batch = _build(stock.config, [[Text(2), Image(64, 96), Text(1)]])
    with torch.no_grad():
        assert torch.equal(patched(**syncfree.prepare(batch, None, patched)).logits, stock(**batch).logits)
