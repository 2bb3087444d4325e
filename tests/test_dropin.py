"""A patched model is a drop-in for the stock one on the paths Transformers' own tests exercise.

Each case here came from running Transformers' model tests against the patch (generation with a
static cache and compiled, assisted decoding, masks that hide placeholders, 4D masks, pickled
models, ``inputs_embeds``, missing token types, signatures), written as a syncfree test: the
patched model (with and without ``prepare``) against a stock model with the same weights,
``torch.equal`` on the CPU, and the sync counts on the emulated device.
"""

from __future__ import annotations

import inspect
import io
import pickle
import warnings

import pytest
import torch

import syncfree
from syncfree.audit import audit, emulate_cuda
from syncfree.inputs import Image, Text, build_inputs, named_layout
from syncfree.presets import build_model


@pytest.fixture(scope="module")
def pair():
    stock = build_model("qwen3-vl-tiny")
    return stock, syncfree.patch(build_model("qwen3-vl-tiny"))


@pytest.fixture(scope="module")
def qwen25():
    stock = build_model("qwen2.5-vl-tiny")
    return stock, syncfree.patch(build_model("qwen2.5-vl-tiny"))


def _variants(patched, batch):
    """The ways a user hands a batch to the patched model: as is, prepared on the CPU, prepared in a worker."""
    return {"no prepare": batch, "prepare(cpu)": syncfree.prepare(batch, "cpu", patched),
            "prepare(None)": syncfree.prepare(batch, None, patched)}


def _logits(model, kwargs, **extra):
    model.model.rope_deltas = None
    with torch.no_grad():
        return model(**kwargs, **extra).logits


def _masked_placeholders(config):
    """A batch whose attention mask hides one image's placeholders and part of a row's text, as the mask of
    Transformers' model testers does. Stock gives each unmasked placeholder run the next grid in order, so
    with images of one size it still runs (with different sizes it fails, stock and patched alike)."""
    batch = build_inputs(config, [[Text(3), Image(64, 64), Text(2), Image(64, 64), Text(2)],
                                  [Text(2), Image(64, 64), Text(4)]])
    mask = batch["attention_mask"].clone()
    first_image = (batch["mm_token_type_ids"][0] == 1).nonzero().flatten()[:4]
    mask[0, first_image] = 0
    mask[1, -3:] = 0
    batch["attention_mask"] = mask
    return batch


def test_placeholders_under_a_zero_attention_mask_get_their_features_as_in_stock(pair):
    stock, patched = pair
    batch = _masked_placeholders(stock.config)
    expected = _logits(stock, batch)
    for how, kwargs in _variants(patched, batch).items():
        assert torch.equal(_logits(patched, kwargs), expected), how


def test_masked_placeholders_cost_no_sync_with_prepare(pair):
    _, patched = pair
    batch = _masked_placeholders(patched.config)
    with emulate_cuda(), torch.no_grad():
        patched.to("cuda")
        try:
            kwargs = syncfree.prepare(batch, "cuda", patched)
            with audit() as report:
                patched(**kwargs)
        finally:
            patched.to("cpu")
    assert report.syncs == [] and report.blocking_copies == []


@pytest.mark.parametrize("options", [{"cache_implementation": "static"}, {"num_beams": 2, "num_return_sequences": 2},
                                     {"cache_implementation": "static", "num_beams": 2}],
                         ids=["static", "beams", "static+beams"])
def test_generate_matches_stock(pair, options):
    stock, patched = pair
    batch = build_inputs(stock.config, named_layout("mixed", 64))
    kw = dict(max_new_tokens=4, do_sample=False, **options)
    with torch.no_grad():
        expected = stock.generate(**batch, **kw)
        for how, kwargs in _variants(patched, batch).items():
            assert torch.equal(patched.generate(**kwargs, **kw), expected), how


def test_compiled_generate_with_a_static_cache_traces_the_patched_forward_whole():
    from transformers import CompileConfig

    # Own models: generate() keeps the compiled forward on the model (and it does not pickle).
    stock, patched = build_model("qwen3-vl-tiny"), syncfree.patch(build_model("qwen3-vl-tiny"))
    batch = build_inputs(stock.config, named_layout("mixed", 64))
    config = CompileConfig(fullgraph=True, dynamic=False, backend="eager")
    config._compile_all_devices = True  # compile on the CPU too
    kw = dict(max_new_tokens=3, do_sample=False, cache_implementation="static", compile_config=config)
    torch.compiler.reset()
    with torch.no_grad():
        expected = stock.generate(**batch, **kw)
        for how, kwargs in (("no prepare", batch), ("prepare", syncfree.prepare(batch, "cpu", patched))):
            torch.compiler.reset()
            assert torch.equal(patched.generate(**kwargs, **kw), expected), how


def test_assisted_decoding_matches_stock(pair):
    stock, patched = pair
    batch = build_inputs(stock.config, [[Text(5), Image(64, 64), Text(6)]])
    # The assistant proposes tokens every step; the main model's first forward then holds the prompt and
    # the candidates, with mm_token_type_ids still the prompt's length (as generate() hands it over).
    assistant = build_model("qwen3-vl-tiny", seed=1)
    kw = dict(max_new_tokens=4, do_sample=False, assistant_model=assistant)
    with torch.no_grad():
        expected = stock.generate(**batch, **kw)
        for how, kwargs in _variants(patched, batch).items():
            assert torch.equal(patched.generate(**kwargs, **kw), expected), how


def test_a_4d_mask_with_precomputed_positions_matches_stock(pair):
    stock, patched = pair
    batch = build_inputs(stock.config, named_layout("mixed", 64))
    positions, _ = stock.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"], batch["image_grid_thw"],
                                              batch["video_grid_thw"], batch["attention_mask"])
    seq = batch["input_ids"].shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    mask4d = causal[None, None] & batch["attention_mask"].bool()[:, None, None, :]
    batch4d = {**batch, "attention_mask": mask4d, "position_ids": positions}
    expected = _logits(stock, batch4d)
    assert torch.equal(_logits(patched, batch4d), expected)


def test_pickled_patched_model_stays_patched():
    patched = syncfree.patch(build_model("qwen3-vl-tiny"))
    buffer = io.BytesIO()
    torch.save(patched, buffer)
    buffer.seek(0)
    for restored in (pickle.loads(pickle.dumps(patched)), torch.load(buffer, weights_only=False)):
        assert syncfree.is_patched(restored)
        batch = build_inputs(patched.config, named_layout("mixed", 64))
        assert torch.equal(_logits(restored, batch), _logits(patched, batch))
        with emulate_cuda(), torch.no_grad():
            restored.to("cuda")
            moved = {k: v.to("cuda") for k, v in batch.items()}
            with audit() as report:
                restored(**moved)
        assert len(report.syncs) == 1  # the one explicit read, not stock's dozens


def test_is_patched_tells_the_truth_after_unpatch_and_deepcopy(pair):
    import copy

    _, patched = pair
    twin = copy.deepcopy(patched)
    assert syncfree.is_patched(twin)
    syncfree.unpatch(twin)
    assert not syncfree.is_patched(twin) and syncfree.is_patched(patched)


def test_inputs_embeds_and_rope_deltas_left_by_an_earlier_call_match_stock(pair):
    stock, patched = pair
    batch = build_inputs(stock.config, named_layout("mixed", 64))
    embeds = {k: v for k, v in batch.items() if k != "input_ids"}
    results = []
    for model in (stock, patched):
        model.model.rope_deltas = None
        with torch.no_grad():
            first = model(**batch).logits  # leaves rope_deltas behind, which the next call reads (stock behaviour)
            embeds["inputs_embeds"] = model.get_input_embeddings()(batch["input_ids"])
            second = model(**embeds).logits
        results.append((first, second))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_missing_token_types_behave_as_in_stock(pair, qwen25):
    for stock, patched in (pair, qwen25):
        batch = build_inputs(stock.config, named_layout("image", 64 if "qwen3" in stock.config.model_type else 56,
                                                          32 if "qwen3" in stock.config.model_type else 28))
        del batch["mm_token_type_ids"]
        try:
            expected = _logits(stock, batch)
        except ValueError as err:
            with pytest.raises(ValueError) as got:
                _logits(patched, batch)
            assert str(got.value) == str(err)
            continue
        assert torch.equal(_logits(patched, batch), expected)


def test_a_plan_made_stale_by_editing_the_batch_is_refused(pair):
    _, patched = pair
    batch = build_inputs(patched.config, named_layout("mixed", 64))
    new_mask = batch["attention_mask"].clone()
    new_mask[0, -2:] = 0  # the last two tokens of the first row (not padding before)

    kwargs = syncfree.prepare(batch, "cpu", patched)
    kwargs["attention_mask"] = new_mask
    with pytest.raises(ValueError, match="attention_mask was replaced by another tensor after syncfree.prepare"):
        _logits(patched, kwargs)

    kwargs = syncfree.prepare(batch, "cpu", patched)
    kwargs["input_ids"][0, 0] = 7  # in place
    with pytest.raises(ValueError, match="input_ids was modified in place after syncfree.prepare"):
        _logits(patched, kwargs)

    batch = build_inputs(patched.config, named_layout("mixed", 64))
    kwargs = syncfree.prepare(batch, None, patched)  # the plan travels in the dict (DataLoader workers)
    kwargs["attention_mask"] = new_mask
    with pytest.raises(ValueError, match="attention_mask differs from the batch its syncfree plan was built for"):
        _logits(patched, kwargs)


def _patched_functions(patched):
    for module in patched.modules():
        for attr, value in module.__dict__.items():
            if inspect.ismethod(value) and getattr(type(module), attr, None) is not None:
                yield type(module), attr, value


def test_patched_functions_keep_the_stock_signatures_and_docs(pair):
    _, patched = pair
    seen = 0
    for cls, attr, method in _patched_functions(patched):
        stock = getattr(cls, attr)
        assert inspect.signature(method.__func__) == inspect.signature(stock), f"{cls.__name__}.{attr}"
        assert method.__func__.__doc__ == stock.__doc__, f"{cls.__name__}.{attr}"
        seen += 1
    assert seen >= 7


def test_deprecated_arguments_warn_as_in_stock(pair):
    stock, patched = pair
    if "cache" not in inspect.signature(type(stock.model).forward).parameters:
        pytest.skip("this Transformers release has no renamed cache argument")
    batch = build_inputs(stock.config, named_layout("image", 64))
    caught = []
    for model in (stock, patched):
        with warnings.catch_warnings(record=True) as record, torch.no_grad():
            warnings.simplefilter("always")
            model.model(**batch, past_key_values=None)
        caught.append(sorted({(w.category, str(w.message)) for w in record}))
    assert caught[0] == caught[1] and caught[0]
