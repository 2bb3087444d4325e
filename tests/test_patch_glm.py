"""GLM-4.1V, GLM-4.5V and GLM-4.6V: parity with stock, the rotary index against each family's stock function on
drawn layouts, no syncs and no blocking copies with prepare(), the tower handed its grid on the device, stock's
error for a batch with both images and videos (their frames share the image placeholder), generate, gradients,
compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_forward_equals_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    check_rope_index_matches_stock,
    model_pair,
    standard_layouts,
    traced_copy,
)
from syncfree.audit import audit, emulate_cuda
from syncfree.families.glm import build_glm_inputs
from syncfree.inputs import Image, Text, Video
from syncfree.presets import build_model

PRESETS = ("glm4.1v-tiny", "glm4.5v-tiny", "glm4.6v-tiny", "glm-ocr-tiny")
DTYPE = {"glm4.5v-tiny": torch.bfloat16}  # MoE experts are sync-free on the grouped-matmul path (bf16)


def _pair(name: str, attn: str = "sdpa", dtype=torch.float32):
    return model_pair(name, attn, dtype)


# Pixels are multiples of 28 (patch 14 x merge 2). Stock accepts a batch with images or with videos, not both.
LAYOUTS = {
    "one image": [[Text(4), Image(168, 224), Text(3)]],
    "images of different sizes": [[Text(2), Image(56, 84), Text(1), Image(224, 112), Text(1), Image(28, 28), Text(2)]],
    "video": [[Text(3), Video(6, 112, 140), Text(2)]],
    "videos of different sizes": [[Text(1), Video(4, 56, 56), Text(2), Video(2, 84, 56), Text(1)]],
    "images and a text-only row": [[Text(2), Image(112, 168), Text(5)], [Text(1), Image(56, 56), Text(1)], [Text(3)]],
}
# (The standard layouts' parity with stock is the conformance suite's: tests/test_conformance.py.)
OWN_LAYOUTS = [name for name in LAYOUTS if name not in standard_layouts(1)]


def test_video_frames_are_image_placeholders_typed_video():
    config = _pair("glm4.1v-tiny")[0].config
    batch = build_glm_inputs(config, LAYOUTS["video"])
    frames = (batch["mm_token_type_ids"] == 2)
    assert frames.any() and torch.equal(frames, batch["input_ids"] == config.image_token_id)
    assert not (batch["input_ids"] == config.video_token_id).any()
    assert int((batch["input_ids"] == config.image_start_token_id).sum()) == 6 // 2  # a begin per temporal patch


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", OWN_LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", PRESETS)
def test_forward_equals_stock_on_its_own_layouts(name, attn, layout, padding):
    stock, patched = _pair(name, attn)
    batch = build_glm_inputs(stock.config, LAYOUTS[layout], padding_side=padding)
    check_forward_equals_stock(stock, patched, batch)


@pytest.mark.parametrize("name", PRESETS)
def test_images_and_videos_together_fail_as_stock_fails(name):
    stock, patched = _pair(name)
    batch = build_glm_inputs(stock.config, [[Text(2), Image(56, 56), Text(1), Video(2, 56, 56), Text(1)]])
    with torch.no_grad():
        with pytest.raises(Exception) as want:
            stock(**batch)
        with pytest.raises(type(want.value)) as got:
            patched(**batch)
    assert str(got.value) == str(want.value)
    with pytest.raises(ValueError, match=str(want.value).split(",")[0]):  # prepare() says it with stock's words
        syncfree.prepare(batch, None, patched)


side = st.integers(1, 4).map(lambda n: 28 * n)
images = st.lists(st.one_of(st.builds(Text, st.integers(1, 4)), st.builds(Image, side, side)), min_size=1, max_size=4)
videos = st.lists(st.one_of(st.builds(Text, st.integers(1, 4)),
                            st.builds(Video, st.sampled_from([2, 4, 6]), side, side)), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from([images, videos]).flatmap(lambda rows: st.lists(rows, min_size=1, max_size=3)),
       left=st.booleans(), seed=st.integers(0, 2**16), name=st.sampled_from(PRESETS))
def test_rope_index_matches_each_familys_stock_function(kind, left, seed, name):
    stock, _ = _pair(name)
    check_rope_index_matches_stock(stock, build_glm_inputs(stock.config, kind, padding_side="left" if left else "right",
                                                           seed=seed))


@pytest.mark.parametrize("name", PRESETS)
def test_prepared_prefill_has_no_sync_and_no_blocking_copy_and_the_tower_gets_its_grid_on_the_device(name):
    dtype = DTYPE.get(name, torch.float32)
    stock, patched = _pair(name, dtype=dtype)
    batch = build_glm_inputs(stock.config, LAYOUTS["images and a text-only row"])
    if dtype != torch.float32:
        batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
    grids = []
    # The embeddings index the grid with device tensors: a host grid would fail on a real GPU (GLM-OCR has none).
    embeddings = getattr(patched.model.visual, "embeddings", None) or torch.nn.Identity()
    hook = embeddings.register_forward_pre_hook(lambda m, args: grids.append(args[2].device))
    try:
        check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)
    finally:
        hook.remove()
    assert all(d.type == "cuda" for d in grids) and (bool(grids) == hasattr(patched.model.visual, "embeddings"))


def test_glm_ocr_blocks_get_the_chosen_attention_backend():
    """GLM-OCR's tower calls its blocks without **kwargs: the backend must still reach the attention (one SDPA
    call for four equal images with "grouped", one per image with stock's split)."""
    stock, _ = _pair("glm-ocr-tiny")
    grid = torch.tensor([[1, 4, 4]] * 4)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(0))
    counts = {}
    for backend in ("split", "grouped"):
        tower = syncfree.patch(build_model("glm-ocr-tiny").model.visual, vision_attention=backend)
        tower.load_state_dict(stock.model.visual.state_dict())
        with torch.no_grad(), emulate_cuda():
            tower.to("cuda")
            try:
                with audit() as report:
                    out = tower(pixels.to("cuda"), grid_thw=grid).pooler_output
                out = out.cpu()
            finally:
                tower.to("cpu")
        with torch.no_grad():
            assert torch.equal(out, stock.model.visual(pixels, grid_thw=grid).pooler_output)
        counts[backend] = report.launch_ops.get("aten::scaled_dot_product_attention", 0)
    depth = stock.config.vision_config.depth
    assert counts == {"split": 4 * depth, "grouped": depth}


@pytest.mark.parametrize("name", PRESETS)
def test_patched_vision_tower_compiles_without_graph_breaks(name):
    _, patched = _pair(name)
    batch = build_glm_inputs(patched.config, [[Image(168, 224), Image(56, 84)]])
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    explained = torch._dynamo.explain(traced_copy(patched.model.visual))(batch["pixel_values"], grid_thw=plan.grid_thw,
                                                            syncfree_vision_plan=plan)
    assert explained.graph_break_count == 0
