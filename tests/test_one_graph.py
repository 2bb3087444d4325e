"""The whole prepared forward as one graph: for every family whose layout says so (``Layout.one_graph``), Dynamo traces
the patched forward on inputs from ``syncfree.prepare`` without a graph break, and ``torch.compile(fullgraph=True)``
gives the eager patched outputs, in inference and in a training step.

Models and batches are the census's (``tiny_model_and_batch``: its own shrunken configs, two images of different
sizes), not the ones the family tests were written against. Gradients: Dynamo's graph accumulates a parameter's
gradient contributions in its own order, so they agree with eager to float rounding (stock's own compiled forward
shows the same differences); the forward's outputs and the loss are equal.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import syncfree
from family_checks import TINY, standard_layouts
from syncfree.census.run import discover, family_batch, patched_type, tiny_model_and_batch
from syncfree.families import FAMILIES
from syncfree.inputs import (
    ASR_LAYOUT_NAMES,
    OMNI_LAYOUT_NAMES,
    asr_layout,
    is_audio_only,
    is_omni,
    omni_layout,
    processor_batch,
)
from syncfree.plan.errors import InputsNotTaken, StalePlan
from syncfree.plan.spec import ModelSpec, layout_of
from syncfree.presets import build_model

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # (tests/conftest.py)

ONE_GRAPH = [f for f in discover() if layout_of(patched_type(f)) is not None and layout_of(patched_type(f)).one_graph]
# The training step's equality is checked for these in the default run, for the rest in the slow step.
# The default run checks these; every other family of ONE_GRAPH is checked the same way in the slow step.
_QUICK = {"qwen2_5_vl", "qwen3_vl", "glm4v"}
_QUICK_TRAINING = {"qwen2_5_vl"}


def _patched(family: str):
    stock, batch = tiny_model_and_batch(family)
    if not hasattr(stock, "lm_head") and family in TINY:
        # (the census builds some families' bare *Model, without the head whose loss training needs: the tiny preset's
        # model, on the census's layout of it)
        stock = build_model(TINY[family])
        batch = family_batch(stock)
    return syncfree.patch(stock), batch


def _labelled(model, batch: dict) -> dict:
    ids = batch["input_ids"]
    vocab = model.config.get_text_config().vocab_size
    return {**batch, "labels": torch.where(ids < vocab, ids, -100)}


def test_the_families_that_trace_whole_include_the_qwen_and_glm_lines():
    named = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "glm4v", "paddleocr_vl", "video_llama_3", "kimi_k25",
             "hunyuan_vl", "hy_v4_vl", "qwen3_asr", "qwen2_5_omni_thinker", "qwen3_omni_moe_thinker", "glm_image",
             "ernie4_5_vl_moe", "ovis2_5", "glm5_next", "qwen4_exp"}
    # (those this Transformers release has and syncfree registers; the census, which the tests run, may not build each)
    assert all(layout_of(f).one_graph for f in named & set(FAMILIES))
    assert {"qwen2_5_vl", "qwen3_vl", "glm4v"} <= set(ONE_GRAPH)


@pytest.mark.parametrize("family", [pytest.param(f, marks=[] if f in _QUICK else [pytest.mark.slow])
                                    for f in ONE_GRAPH])
def test_whole_prepared_forward_compiles_as_one_graph_with_the_eager_logits(family):
    # (fullgraph=True: Dynamo raises at the first graph break, so one compiled frame is one graph, no break)
    model, batch = _patched(family)
    counter = CompileCounter()
    with torch.no_grad():
        expected = model(**syncfree.prepare(batch, "cpu", model)).logits
        compiled = torch.compile(model, fullgraph=True, backend=counter)
        assert torch.equal(compiled(**syncfree.prepare(batch, "cpu", model)).logits, expected)
    assert counter.frame_count == 1


@pytest.mark.parametrize("family", [pytest.param(f, marks=[] if f in _QUICK_TRAINING else [pytest.mark.slow])
                                    for f in ONE_GRAPH])
def test_fullgraph_training_step_gives_the_eager_loss_and_gradients(family):
    model, batch = _patched(family)
    model.train()
    labelled = _labelled(model, batch)
    loss = model(**syncfree.prepare(labelled, "cpu", model)).loss
    loss.backward()
    eager_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    compiled_loss = torch.compile(model, fullgraph=True, backend="eager")(**syncfree.prepare(labelled, "cpu", model)).loss
    compiled_loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert torch.equal(compiled_loss, loss)
    assert grads.keys() == eager_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], msg=name)


_LAYOUTS = ("one image", "images of different sizes", "video", "image and videos", "padding and a text-only row")
# (Kimi-K2.5 is left out: the generic layout builder draws text ids past its census model's vocabulary, which its
# forward embeds as they are; its own batch is the census one, above.)
_LAID_OUT = [f for f in ONE_GRAPH if f != "kimi_k25"]


@pytest.mark.slow
@pytest.mark.parametrize("family", _LAID_OUT)
def test_every_standard_layout_compiles_as_one_graph_with_the_eager_logits(family):
    model, _ = _patched(family)
    if is_audio_only(family):  # (its processor takes clips, no images: its own named layouts)
        names, layouts = ASR_LAYOUT_NAMES, {name: asr_layout(name) for name in ASR_LAYOUT_NAMES}
    else:
        vc = model.config.vision_config
        unit = vc.patch_size * max(getattr(vc, "spatial_merge_size", 1) or 1,
                                   ModelSpec.from_config(model.config).spatial_merge_size)
        names, layouts = _LAYOUTS, standard_layouts(unit)
        if is_omni(model.config):  # (and its own, with audio clips and a video's audio track)
            names += tuple(f"omni {name}" for name in OMNI_LAYOUT_NAMES)
            layouts.update({f"omni {name}": omni_layout(name, unit=unit) for name in OMNI_LAYOUT_NAMES})
    ran = 0
    for name in names:
        try:
            batch = processor_batch(model.config, layouts[name])
        except (ValueError, InputsNotTaken):  # (a family without videos, or that refuses a mix)
            continue
        with torch.no_grad():
            expected = model(**syncfree.prepare(batch, "cpu", model)).logits
            got = torch.compile(model, fullgraph=True, backend="eager")(**syncfree.prepare(batch, "cpu", model)).logits
            assert torch.equal(got, expected), name
        torch._dynamo.reset()
        ran += 1
    assert ran >= 2


def test_a_batch_of_the_same_layout_reuses_the_graph_and_another_layout_compiles_again():
    model, batch = _patched("qwen2_5_vl")
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)

    def fresh(b: dict) -> dict:  # a new batch of the same values, prepared anew (new tensors, a new plan)
        return syncfree.prepare({k: v.clone() for k, v in b.items()}, "cpu", model)

    with torch.no_grad():
        compiled(**fresh(batch))
        compiled(**fresh(batch))  # (stock's forward keeps rope_deltas on the model after the first call: one recompile)
        warm = counter.frame_count
        compiled(**fresh(batch))
        compiled(**fresh(batch))
        assert counter.frame_count == warm
        text_only = {"input_ids": batch["input_ids"][:, :8], "attention_mask": batch["attention_mask"][:, :8]}
        compiled(**fresh(text_only))
    assert counter.frame_count > warm


def test_a_batch_edited_after_prepare_is_refused_inside_the_graph():
    model, batch = _patched("qwen2_5_vl")
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        prepared = syncfree.prepare(batch, "cpu", model)
        compiled(**prepared)
        prepared["attention_mask"][0, -1] = 1 - prepared["attention_mask"][0, -1]  # in place: the same objects
        with pytest.raises(RuntimeError, match="attention_mask differs from the batch its plan was built for"):
            compiled(**prepared)
        # A tensor removed or set to None: refused before Dynamo traces (the patched model's forward pre-hook, which a
        # compiled module runs outside Dynamo), with the eager error, fullgraph or not; never Dynamo's "Observed
        # exception" with ours in its debug context.
        removed = dict(syncfree.prepare(batch, "cpu", model), attention_mask=None)
        with pytest.raises(StalePlan, match="attention_mask was removed"):
            torch.compile(model, backend="eager")(**removed)
        with pytest.raises(StalePlan, match="attention_mask was removed"):
            compiled(**removed)
        popped = syncfree.prepare(batch, "cpu", model)
        popped.pop("attention_mask")
        with pytest.raises(StalePlan, match="^attention_mask was removed"):
            compiled(**popped)


def test_without_a_plan_the_compiled_forward_is_stocks():
    stock, batch = tiny_model_and_batch("qwen2_5_vl")
    patched = syncfree.patch(copy.deepcopy(stock))
    counter = CompileCounter()
    with torch.no_grad():
        expected = stock(**batch).logits
        assert torch.equal(torch.compile(patched, backend=counter)(**batch).logits, expected)
    assert counter.frame_count > 1  # stock's data-dependent reads break its graph, as they do stock's
