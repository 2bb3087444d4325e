"""The vision towers' flash/varlen path, patched: same output as stock, no host read of the lengths.

flash-attn has no CPU build, so a CPU stand-in for its varlen kernel is registered under a name
holding "flash" (which is what sends Transformers' vision attention down that path). It attends
within the segments that ``cu_seq_lens_q`` marks, without reading them on the host, and records
the ``max_length_q`` it was handed. Stock computes that maximum with ``.item()``; the patched
tower takes it from the host plan.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.utils.generic import is_flash_attention_requested

import syncfree
from syncfree.inputs import build_inputs, named_layout
from syncfree.prepare import plan_of
from syncfree.presets import build_vision_model, load_config

NAME = "syncfree_test_flash_varlen"
SEEN_MAX_LENGTHS: list = []


def varlen_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                     cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None,
                     is_causal=False, **kwargs):
    assert attention_mask is None and cu_seq_lens_q is not None and not is_causal
    SEEN_MAX_LENGTHS.append(max_length_q)
    n = query.shape[2]
    segment = torch.searchsorted(cu_seq_lens_q[1:].contiguous(), torch.arange(n, device=query.device), right=True)
    mask = segment[:, None] == segment[None, :]  # block-diagonal: each token sees its own segment
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, varlen_attention)

MODELS = ("qwen3-vl-tiny", "qwen3-vl-moe-tiny", "qwen2.5-vl-tiny", "qwen2-vl-tiny")


def _tower_and_inputs(model_name: str, attn: str = NAME):
    config = load_config(model_name)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    batch = build_inputs(config, named_layout("mixed", 64 if unit == 32 else 56, unit))
    tower = build_vision_model(model_name, attn="sdpa")
    if attn == NAME:
        # Set after building: at build time Transformers would look for the flash-attn package.
        tower.config._attn_implementation = NAME
        assert is_flash_attention_requested(tower.config)
    return tower, batch, config


def _vision(tower, batch, plan=None):
    outs = []
    for pixels, grid, kind in (("pixel_values", "image_grid_thw", "image"),
                               ("pixel_values_videos", "video_grid_thw", "video")):
        extra = {"syncfree_vision_plan": getattr(plan, kind)} if plan is not None else {}
        out = tower(batch[pixels], grid_thw=batch[grid], **extra)
        outs.append(out.pooler_output if hasattr(out, "pooler_output") else out)
    return outs


@pytest.fixture(autouse=True)
def _stock_afterwards():
    yield
    syncfree.unpatch()


@pytest.mark.parametrize("model_name", MODELS)
def test_patched_varlen_path_equals_stock_and_hands_the_kernel_host_max_lengths(model_name):
    tower, batch, config = _tower_and_inputs(model_name)
    with torch.no_grad():
        SEEN_MAX_LENGTHS.clear()
        stock = _vision(tower, batch)
        stock_lengths = list(SEEN_MAX_LENGTHS)
        syncfree.patch(tower)
        for plan in (None, syncfree.prepare(batch, None, config)["syncfree_plan"]):
            SEEN_MAX_LENGTHS.clear()
            patched = _vision(tower, batch, plan)
            assert all(torch.equal(a, b) for a, b in zip(stock, patched))
            assert SEEN_MAX_LENGTHS == stock_lengths
            assert all(type(n) is int for n in SEEN_MAX_LENGTHS)  # host ints, never a device scalar
    assert len(stock_lengths) == 2 * config.vision_config.depth  # every layer of both towers' calls went varlen


@pytest.mark.parametrize("model_name", ("qwen3-vl-tiny", "qwen2.5-vl-tiny"))
def test_patched_varlen_path_reads_nothing_on_the_host(model_name):
    tower, batch, config = _tower_and_inputs(model_name)
    syncfree.patch(tower)
    with syncfree.emulate_cuda(), torch.no_grad():
        tower.to("cuda")
        try:
            device_batch = syncfree.prepare(batch, "cuda", config)
            with syncfree.assert_no_sync():
                _vision(tower, device_batch, plan_of(device_batch))
            syncfree.unpatch(tower)
            moved = {k: v.to("cuda") for k, v in batch.items()}
            with syncfree.audit() as stock:
                _vision(tower, moved)
        finally:
            tower.to("cpu")
    # Stock reads the lengths' maximum back (Transformers' get_max_seqlen), among its other syncs.
    assert any("max_seqlen" in e.where.code or "get_max_seqlen" in str(e.stack) for e in stock.syncs)


def test_the_stand_in_is_a_real_varlen_kernel():
    # Against the SDPA path (one call per segment), up to the rounding of a different reduction order.
    tower, batch, _ = _tower_and_inputs("qwen3-vl-tiny")
    reference, _, _ = _tower_and_inputs("qwen3-vl-tiny", attn="sdpa")
    with torch.no_grad():
        for got, want in zip(_vision(tower, batch), _vision(reference, batch)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- the bench's "varlen" variant: PyTorch's flash kernel (CUDA only), wired in with a CPU stand-in ----

def _kernel_stand_in(calls):
    """CPU stand-in for torch.nn.attention.varlen.varlen_attn: the same layout, (tokens, heads, head_dim)."""
    def varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None):
        assert q.dim() == 3 and q.shape == k.shape == v.shape and cu_seq_q.dtype == torch.int32
        calls.append((max_q, max_k))
        segment = torch.searchsorted(cu_seq_q[1:].contiguous(), torch.arange(q.shape[0]), right=True)
        mask = segment[:, None] == segment[None, :]
        heads_first = [t.transpose(0, 1) for t in (q, k, v)]
        return F.scaled_dot_product_attention(*heads_first, attn_mask=mask, scale=scale).transpose(0, 1)

    return varlen_attn


@pytest.mark.parametrize("model_name", ("qwen3-vl-tiny", "qwen2.5-vl-tiny"))
def test_bench_varlen_variant_switches_the_vision_tower_only_and_matches_sdpa(model_name, monkeypatch):
    varlen_module = pytest.importorskip("torch.nn.attention.varlen", reason="PyTorch < 2.10 has no varlen kernel")

    from syncfree.compare.varlen import VARLEN_ATTN, use_torch_varlen
    from syncfree.presets import build_model

    calls = []
    monkeypatch.setattr(varlen_module, "varlen_attn", _kernel_stand_in(calls))
    config = load_config(model_name)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    batch = build_inputs(config, named_layout("mixed", 2 * unit, unit))
    reference, model = build_model(model_name, text_layers=2), build_model(model_name, text_layers=2)
    use_torch_varlen(model)
    assert model.model.visual.config._attn_implementation == VARLEN_ATTN
    assert model.model.language_model.config._attn_implementation == "sdpa"
    syncfree.patch(model)
    with torch.no_grad():
        want = reference(**batch).logits
        got = model(**syncfree.prepare(batch, "cpu", model)).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 * config.vision_config.depth  # every layer, for the image and the video call
    assert all(type(a) is int and a == b for a, b in calls)


def test_bench_refuses_varlen_where_the_kernel_cannot_run(capsys):
    import importlib.util

    from syncfree.cli import main

    assert main(["bench", "--device", "cpu", "--attn", "varlen", "--models", "qwen3-vl-tiny"]) == 2
    why = ("runs PyTorch's flash kernel, which needs a CUDA device"
           if importlib.util.find_spec("torch.nn.attention.varlen") else "needs PyTorch 2.10 or newer")
    assert f"--attn varlen {why}" in capsys.readouterr().err


def test_varlen_needs_a_half_precision_dtype_on_cuda():
    import importlib.util

    from syncfree.compare.varlen import varlen_problem

    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        assert "needs PyTorch 2.10" in varlen_problem("cuda", "float32")
        return
    assert "takes bfloat16 or float16 (got --dtype float32)" in varlen_problem("cuda", "float32")
    assert varlen_problem("cuda", "bfloat16") is None and varlen_problem("cuda", "float16") is None
