"""The vision attention backends: exact where claimed, sync-free, fewer launches, clear errors.

``split`` and ``grouped`` are ``torch.equal`` to stock on the CPU (``grouped`` runs each run of
equal-length segments as one batched call over a view: the same arithmetic per segment).
``block_diagonal`` attends over the whole packed sequence with a mask: the softmax sums run over
a different number of (masked-out, zero) terms in another blocking, so it matches to rounding
(tolerance below), not bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from syncfree.audit import audit, emulate_cuda
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.presets import build_model

BLOCK_DIAGONAL_ATOL = 1e-5  # fp32 logits of the tiny models differ by ~2e-7 at most

_stock: dict = {}


def _tower(name: str, attn: str):
    if (name, attn) not in _stock:
        _stock[name, attn] = build_model(name, attn=attn).model.visual
    return _stock[name, attn]


def _patched(tower, backend: str):
    return syncfree.patch(copy.deepcopy(tower), vision_attention=backend)


# Layouts as grids: (t, h, w) in patches (multiples of the merge size 2).
layouts = st.one_of(
    st.just([(1, 4, 4)]),  # one segment
    st.lists(st.just((1, 2, 2)), min_size=2, max_size=6),  # many equal segments
    st.lists(st.tuples(st.just(1), st.sampled_from([2, 4, 6]), st.sampled_from([2, 4, 6])), min_size=1, max_size=5),
    st.tuples(st.integers(1, 6), st.sampled_from([2, 4]), st.sampled_from([2, 4])).map(lambda g: [g]),  # a video
    st.just([(1, 16, 16)]),  # one large segment
)


@settings(max_examples=25, deadline=None)
@given(grid=layouts, attn=st.sampled_from(["sdpa", "eager"]),
       name=st.sampled_from(["qwen3-vl-tiny", "qwen2.5-vl-tiny"]))
def test_backends_against_stock_on_drawn_layouts(grid, attn, name):
    tower = _tower(name, attn)
    patch = 16 if name.startswith("qwen3") else 14
    grid_thw = torch.tensor(grid)
    pixels = torch.randn(int(grid_thw.prod(-1).sum()), 3 * 2 * patch * patch, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = tower(pixels, grid_thw=grid_thw).pooler_output
        for backend in ("split", "grouped", "auto", "block_diagonal"):
            got = _patched(tower, backend)(pixels, grid_thw=grid_thw).pooler_output
            if backend == "block_diagonal":
                torch.testing.assert_close(got, expected, atol=BLOCK_DIAGONAL_ATOL, rtol=0)
            else:
                assert torch.equal(got, expected), backend


@pytest.mark.parametrize("backend", ["grouped", "block_diagonal", "auto"])
def test_every_backend_is_sync_free_and_the_model_output_matches(backend):
    stock = build_model("qwen3-vl-tiny")
    patched = syncfree.patch(build_model("qwen3-vl-tiny"), vision_attention=backend)
    batch = build_inputs(stock.config, [[Text(2), Video(8, 64, 64), Text(2), Image(64, 64), Image(64, 64), Text(1)]])
    with torch.no_grad():
        expected = stock(**batch).logits
        with emulate_cuda():
            patched.to("cuda")
            kwargs = syncfree.prepare(batch, "cuda", patched)
            with syncfree.assert_no_sync():
                logits = patched(**kwargs).logits
            logits = logits.cpu()
    if backend == "block_diagonal":
        torch.testing.assert_close(logits, expected, atol=BLOCK_DIAGONAL_ATOL, rtol=0)
    else:
        assert torch.equal(logits, expected)


def _attention_launches(tower, pixels, grid) -> int:
    with emulate_cuda(), torch.no_grad():
        tower.to("cuda")
        try:
            with audit() as report:
                tower(pixels.to("cuda"), grid_thw=grid.to("cuda"))  # stock needs the grid on the device
        finally:
            tower.to("cpu")
    return report.launch_ops.get("aten::scaled_dot_product_attention", 0)


def test_grouped_runs_a_32_frame_video_with_over_10x_fewer_attention_launches():
    tower = build_model("qwen3-vl-tiny").model.visual
    grid = torch.tensor([[16, 4, 4]])  # 32 frames at temporal patch 2: 16 segments
    pixels = torch.randn(int(grid.prod()), 3 * 2 * 16 * 16)
    stock = _attention_launches(tower, pixels, grid)
    grouped = _attention_launches(_patched(tower, "grouped"), pixels, grid)
    assert stock == 16 * tower.config.depth and grouped == tower.config.depth
    assert stock >= 10 * grouped


def test_unknown_backends_and_varlen_without_cuda_are_refused():
    model = build_model("qwen3-vl-tiny")
    with pytest.raises(ValueError, match="vision_attention must be one of split, grouped, block_diagonal, varlen, "
                                         "auto, got 'packed'"):
        syncfree.patch(model, vision_attention="packed")
    from syncfree.rewrite.attention import varlen_available

    if not varlen_available():
        with pytest.raises(ValueError, match="needs PyTorch 2.10 or newer"):
            syncfree.patch(model, vision_attention="varlen")
        return
    patched = syncfree.patch(model, vision_attention="varlen")
    batch = build_inputs(model.config, [[Text(2), Image(64, 64), Text(1)]])
    with pytest.raises(ValueError, match="needs a CUDA device and bfloat16 or float16 tensors"), torch.no_grad():
        patched(**batch)


def test_varlen_on_an_older_pytorch_is_refused_with_the_fix(monkeypatch):
    from syncfree.rewrite import attention

    monkeypatch.setattr(attention, "varlen_available", lambda: False)
    with pytest.raises(ValueError, match="vision_attention='varlen' needs PyTorch 2.10 or newer.*use 'grouped'"):
        syncfree.patch(build_model("qwen3-vl-tiny"), vision_attention="varlen")


def test_the_backend_goes_with_the_instance_and_unpatch_removes_it():
    model = syncfree.patch(build_model("qwen3-vl-tiny"), vision_attention="grouped")
    assert model.model.visual._syncfree_attention == "grouped"
    syncfree.unpatch(model)
    assert not hasattr(model.model.visual, "_syncfree_attention")
