"""Qwen4-Exp: Qwen3.5's tower and Qwen3-VL's rotary index before a text model of gated-DeltaNet layers (n-gram
per-layer embeddings) and QSA-indexed attention layers, with MoE. Parity with stock over the processor's layouts,
the rotary index against the family's stock function, the QSA indexer's visible keys against stock's over random
padding masks, no syncs and no blocking copies with prepare() (prefill and decode steps), generate (dynamic, static
and beams), gradients (with gradient checkpointing too), compile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_prepared_prefill_is_sync_and_copy_free,
    check_rope_index_matches_stock,
    model_pair,
    standard_layouts,
    tower_graph_breaks,
)
from syncfree.audit import audit, emulate_cuda
from syncfree.inputs import Image, Text, Video, build_inputs, processor_batch

pytestmark = pytest.mark.skipif("qwen4_exp" not in syncfree.families.FAMILIES,
                                reason="this Transformers release has no Qwen4-Exp in the form syncfree supports")
NAME = "qwen4-exp-tiny"
MODELING = "modeling_qwen4_exp.py"


def _pair(attn: str = "sdpa", dtype=torch.float32):
    return model_pair(NAME, attn, dtype)


# Pixels are multiples of 32 (patch 16 x merge 2); videos are one run per frame pair, timestamps between.
LAYOUTS = standard_layouts(32)
GENERATE = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)


def test_the_tiny_model_has_every_kind_of_text_layer():
    config = _pair()[0].config.text_config
    assert set(config.layer_types) == {"linear_attention", "indexed_attention"} and config.ple_layer_ids
    assert config.num_experts > config.num_experts_per_tok and config.indexer_compress_ratio > 1


side = st.integers(1, 4).map(lambda n: 32 * n)
items = st.one_of(st.builds(Text, st.integers(1, 4)), st.builds(Image, side, side),
                  st.builds(Video, st.sampled_from([2, 4, 6]), side, side))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3), left=st.booleans(),
       seed=st.integers(0, 2**16))
def test_rope_index_matches_the_familys_stock_function(rows, left, seed):
    stock, _ = _pair()
    check_rope_index_matches_stock(stock, build_inputs(stock.config, rows, padding_side="left" if left else "right",
                                                       seed=seed))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), batch=st.integers(1, 3), width=st.integers(1, 12), attn=st.sampled_from(["sdpa", "eager"]))
def test_qsa_visible_positions_are_stocks(data, batch, width, attn):
    """For any 2D padding mask (contiguous or not) and any number of cached tokens, the visible keys taken with the
    host's counts are exactly stock's ``nonzero`` of each row of ``create_causal_mask``'s mask."""
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    from syncfree.families.qwen4exp.qsa import visible_counts

    config = _pair(attn)[0].config.text_config
    past = data.draw(st.integers(0, width - 1), label="cached tokens")  # the mask covers them and this call's
    queries = width - past
    bits = data.draw(st.lists(st.lists(st.booleans(), min_size=width, max_size=width), min_size=batch,
                              max_size=batch), label="mask")
    mask2d = torch.tensor(bits, dtype=torch.long)
    cache = None
    if past:
        cache = DynamicCache(config=config)
        layer = config.layer_types.index("indexed_attention")
        kv = torch.zeros(batch, config.num_key_value_heads, past, config.head_dim)
        cache.update(kv, kv, layer)
    embeds = torch.zeros(batch, queries, config.hidden_size)
    mask = create_causal_mask(config=config, inputs_embeds=embeds, attention_mask=mask2d, cache=cache,
                              allow_is_causal_skip=False)
    visible = mask if mask.dtype == torch.bool else mask == 0
    counts = visible_counts(np.array(bits, dtype=bool), past, queries, mask.shape[-1])
    for b in range(batch):
        for q in range(queries):
            want = torch.nonzero(visible[b, 0, q], as_tuple=False)
            assert torch.equal(torch.nonzero_static(visible[b, 0, q], size=counts[b][q]), want)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 14), min_size=1, max_size=3), left=st.booleans(), image=st.booleans(),
       seed=st.integers(0, 2**16))
def test_random_padding_prefill_and_decode_equal_stock(lengths, left, image, seed):
    """Rows of random lengths (so random padding), through the QSA edit in the prefill and every decode step."""
    stock, patched = _pair()
    rows = [[Text(n)] for n in lengths]
    if image:
        rows[0] = [Text(1), Image(64, 32), Text(lengths[0])]
    batch = build_inputs(stock.config, rows, padding_side="left" if left else "right", seed=seed)
    with torch.no_grad():
        assert torch.equal(patched(**syncfree.prepare(batch, None, patched)).logits, stock(**batch).logits)
        if left:  # (generate() wants left padding)
            assert torch.equal(patched.generate(**syncfree.prepare(batch, None, patched), **GENERATE),
                               stock.generate(**batch, **GENERATE))


def test_prepared_prefill_has_no_sync_and_no_blocking_copy_in_bf16():
    """bf16: the MoE experts take no grouped-matmul path on the emulated device (float32's documented remainder)."""
    stock, patched = _pair(dtype=torch.bfloat16)
    batch = processor_batch(stock.config, LAYOUTS["image and videos"] + LAYOUTS["padding and a text-only row"][2:])
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_decode_steps_read_no_visible_count_from_the_device(cache):
    """generate() from a prepared batch on the emulated device: neither the prefill nor a decode step reads a
    count in the modeling code (the QSA indexer's nonzero was one read per row and query; with a static cache
    generate() makes the indexed mask itself), and stock's ids."""
    stock, patched = _pair(dtype=torch.bfloat16)
    batch = build_inputs(stock.config, [[Text(2), Image(64, 32), Text(3)], [Text(2)]], padding_side="left")
    options = dict(GENERATE, max_new_tokens=3, **({"cache_implementation": "static"} if cache == "static" else {}))
    with torch.no_grad():
        expected = stock.generate(**batch, **options)
        with emulate_cuda():
            patched.to("cuda")
            try:
                with audit() as report:
                    ids = patched.generate(**syncfree.prepare(batch, "cuda", patched), **options)
                ids = ids.cpu()
            finally:
                patched.to("cpu")
                patched.model.rope_deltas = None
    assert torch.equal(ids, expected)
    assert not [e for e in report.syncs if e.where and MODELING in str(e.where)]


def test_a_4d_mask_of_the_callers_keeps_stocks_nonzero():
    """A mask syncfree did not see made (the caller's own per-layer masks) takes stock's path, with stock's result."""
    stock, patched = _pair()
    batch = build_inputs(stock.config, [[Text(5)], [Text(3)]], padding_side="left")
    from transformers.masking_utils import create_causal_mask, create_recurrent_attention_mask

    text = stock.model.language_model
    embeds = text.embed_tokens(batch["input_ids"])
    kwargs = dict(config=text.config, inputs_embeds=embeds, attention_mask=batch["attention_mask"], cache=None,
                  allow_is_causal_skip=False)
    masks = {"indexed_attention": create_causal_mask(**kwargs), "linear_attention": create_recurrent_attention_mask(
        config=text.config, inputs_embeds=embeds, attention_mask=batch["attention_mask"], cache=None)}
    with torch.no_grad():
        want = stock(input_ids=batch["input_ids"], attention_mask=masks, use_cache=False).logits
        got = patched(input_ids=batch["input_ids"], attention_mask=masks, use_cache=False).logits
    assert torch.equal(got, want)


def test_patched_vision_tower_compiles_without_graph_breaks():
    _, patched = _pair()
    batch = processor_batch(patched.config, [[Image(96, 128), Image(64, 32)]])
    explained = tower_graph_breaks(patched, patched.model.visual, batch)
    assert explained.graph_break_count == 0
