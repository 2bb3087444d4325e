"""A patched Qwen3-VL computes exactly what stock Transformers computes (fp32 on the CPU, bit for bit).

Stock and patched models are built from the same preset and seed, so their weights are
identical; every comparison is ``torch.equal`` (training gradients included). The inputs
are laid out as the processor lays them out (``syncfree.inputs``), over the layouts where
the patched code takes different paths: several images, mixed sizes, videos (one
placeholder run per temporal patch, timestamps in between), image and video in one
sample, left and right padding, a text-only row in a multimodal batch, and batch size 1.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import syncfree
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.presets import build_model

ATTNS = ("eager", "sdpa")

# name -> (samples, padding side). Pixel sizes are multiples of 32 (patch 16 x merge 2).
LAYOUTS = {
    "one_image": ([[Text(5), Image(64, 64), Text(3)]], "left"),
    "several_images_per_sample": (
        [[Text(4), Image(64, 64), Text(2), Image(32, 32), Text(3)],
         [Text(2), Image(32, 64), Text(1), Image(64, 32), Text(2), Image(32, 32), Text(5)]],
        "left",
    ),
    "images_of_different_sizes": (
        [[Text(3), Image(64, 64), Text(2), Image(32, 96), Text(2), Image(96, 32), Text(4)]], "left"),
    # 6 frames at temporal patch 2: three placeholder runs, timestamps 0.25 s, 1.25 s, 2.25 s (between frames).
    "video": ([[Text(4), Video(6, 64, 64, fps=2.0), Text(3)]], "left"),
    "image_and_video_in_one_sample": (
        [[Text(3), Image(64, 64), Text(2), Video(4, 32, 64, fps=2.0), Text(2), Image(32, 32), Text(3)]], "left"),
    "left_padding": (
        [[Text(3), Image(64, 64), Text(2), Video(4, 32, 64, fps=2.0), Text(3)],
         [Text(2), Image(32, 32), Text(4)],
         [Text(1), Video(4, 64, 32, fps=1.0), Text(2)]],
        "left",
    ),
    "right_padding": (
        [[Text(3), Image(64, 64), Text(2), Video(4, 32, 64, fps=2.0), Text(3)],
         [Text(2), Image(32, 32), Text(4)],
         [Text(1), Video(4, 64, 32, fps=1.0), Text(2)]],
        "right",
    ),
    "text_only_row_in_multimodal_batch": (
        [[Text(4), Image(64, 64), Text(2), Video(4, 32, 32), Text(2)],
         [Text(9)],
         [Text(2), Image(32, 64), Text(3)]],
        "left",
    ),
    "batch_size_1": ([[Text(2), Video(4, 32, 32, fps=2.0), Text(1), Image(32, 64), Text(2)]], "left"),
}

GRID_KEYS = ("image_grid_thw", "video_grid_thw")


def _inputs(config, layout: str, seed: int = 0) -> dict:
    samples, side = LAYOUTS[layout]
    return build_inputs(config, samples, padding_side=side, seed=seed)


def _rope_index(model, batch, **extra):
    return model.model.get_rope_index(
        input_ids=batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
        image_grid_thw=batch.get("image_grid_thw"), video_grid_thw=batch.get("video_grid_thw"),
        attention_mask=batch["attention_mask"], **extra,
    )


def _assert_same_tensor(actual, expected, what: str):
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != stock {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != stock {tuple(expected.shape)}"
    assert torch.equal(actual, expected), f"{what} differs from stock"


def _forward(model, kwargs, expect_deltas: bool = True):
    """One no-grad forward from a clean rope cache; returns the logits and the rope deltas the forward stored."""
    model.model.rope_deltas = None
    with torch.no_grad():
        logits = model(**kwargs).logits
    deltas = model.model.rope_deltas
    if expect_deltas:
        assert deltas is not None
    return logits, None if deltas is None else deltas.clone()


def _pair(preset: str, attn: str):
    stock = build_model(preset, attn=attn)
    patched = syncfree.patch(build_model(preset, attn=attn))
    # Another test may have patched the classes and not undone it: then "stock" would not be stock.
    assert not syncfree.is_patched(stock)
    assert syncfree.is_patched(patched)
    return stock, patched


@pytest.fixture(scope="module")
def dense_eager():
    return _pair("qwen3-vl-tiny", "eager")


@pytest.fixture(scope="module")
def dense_sdpa():
    return _pair("qwen3-vl-tiny", "sdpa")


@pytest.fixture(scope="module")
def moe_sdpa():
    return _pair("qwen3-vl-moe-tiny", "sdpa")


@pytest.fixture
def pair(request):
    return request.getfixturevalue({"eager": "dense_eager", "sdpa": "dense_sdpa"}[request.param])


# ---- 1. forward parity over layouts --------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("pair", ATTNS, indirect=True)
def test_forward_logits_and_rope_deltas_equal_stock(pair, layout):
    stock, patched = pair
    batch = _inputs(stock.config, layout)
    expected_logits, expected_deltas = _forward(stock, batch)
    assert not torch.isnan(expected_logits).any()  # torch.equal is False on NaN: make sure none are compared

    logits, deltas = _forward(patched, batch)
    _assert_same_tensor(logits, expected_logits, "logits (patched, no prepare)")
    _assert_same_tensor(deltas, expected_deltas, "rope_deltas (patched, no prepare)")

    kwargs = syncfree.prepare(batch, None, patched)
    logits, deltas = _forward(patched, kwargs)
    _assert_same_tensor(logits, expected_logits, "logits (patched, prepare)")
    _assert_same_tensor(deltas, expected_deltas, "rope_deltas (patched, prepare)")


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("pair", ATTNS, indirect=True)
def test_get_rope_index_equals_stock(pair, layout):
    stock, patched = pair
    batch = _inputs(stock.config, layout)
    grids_before = {k: batch[k].clone() for k in GRID_KEYS if k in batch}
    with torch.no_grad():
        expected_pos, expected_deltas = _rope_index(stock, batch)
        pos, deltas = _rope_index(patched, batch)
        _assert_same_tensor(pos, expected_pos, "position_ids")
        _assert_same_tensor(deltas, expected_deltas, "rope_deltas")
        # The index prepare() plans on the host (what the patched forward hands back): the same numbers.
        plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
        _assert_same_tensor(plan.position_ids, expected_pos, "position_ids (plan)")
        _assert_same_tensor(plan.rope_deltas, expected_deltas, "rope_deltas (plan)")
    for key, grid in grids_before.items():  # neither version may rewrite the caller's grids in place
        assert torch.equal(batch[key], grid), key


# ---- 2. vision tower parity ----------------------------------------------------------------------------------
def _assert_same_vision(out, expected, what: str):
    _assert_same_tensor(out.last_hidden_state, expected.last_hidden_state, f"{what} last_hidden_state")
    _assert_same_tensor(out.pooler_output, expected.pooler_output, f"{what} pooler_output")
    assert len(out.deepstack_features) == len(expected.deepstack_features) > 0
    for level, (feature, stock_feature) in enumerate(zip(out.deepstack_features, expected.deepstack_features)):
        _assert_same_tensor(feature, stock_feature, f"{what} deepstack_features[{level}]")


@pytest.mark.parametrize("modality", ["image", "video"])
@pytest.mark.parametrize("pair", ATTNS, indirect=True)
def test_vision_tower_equals_stock(pair, modality):
    stock, patched = pair
    # Several items of different sizes, so the attention segments differ in length.
    batch = _inputs(stock.config, "several_images_per_sample" if modality == "image" else "left_padding")
    pixels, grid = ((batch["pixel_values"], batch["image_grid_thw"]) if modality == "image"
                    else (batch["pixel_values_videos"], batch["video_grid_thw"]))
    with torch.no_grad():
        expected = stock.model.visual(pixels, grid_thw=grid)
        _assert_same_vision(patched.model.visual(pixels, grid_thw=grid), expected, f"{modality} tower")
        plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
        vision_plan = plan.image if modality == "image" else plan.video
        _assert_same_vision(patched.model.visual(pixels, grid_thw=grid, syncfree_vision_plan=vision_plan), expected,
                            f"{modality} tower (plan)")


# ---- 3. MoE ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["left_padding", "right_padding", "text_only_row_in_multimodal_batch"])
def test_moe_forward_equals_stock(moe_sdpa, layout):
    stock, patched = moe_sdpa
    batch = _inputs(stock.config, layout)
    expected_logits, expected_deltas = _forward(stock, batch)
    assert not torch.isnan(expected_logits).any()
    for kwargs, how in ((batch, "no prepare"), (syncfree.prepare(batch, None, patched), "prepare")):
        logits, deltas = _forward(patched, kwargs)
        _assert_same_tensor(logits, expected_logits, f"MoE logits ({how})")
        _assert_same_tensor(deltas, expected_deltas, f"MoE rope_deltas ({how})")
    with torch.no_grad():
        for got, want, what in zip(_rope_index(patched, batch), _rope_index(stock, batch), ("position_ids", "deltas")):
            _assert_same_tensor(got, want, f"MoE {what}")


# ---- 4. generate -----------------------------------------------------------------------------------------------
GENERATE = dict(max_new_tokens=4, do_sample=False, return_dict_in_generate=True, output_logits=True)


def _generation_batch(config):
    # Two rows, left-padded (as for generation): image and video in the first, an image in the second.
    return build_inputs(config, [[Text(3), Image(64, 64), Text(2), Video(4, 32, 32), Text(2)],
                                 [Text(2), Image(32, 64), Text(3)]], padding_side="left", seed=1)


def _generate(model, kwargs):
    model.model.rope_deltas = None
    pad = model.config.text_config.pad_token_id
    with torch.no_grad():
        out = model.generate(**kwargs, **GENERATE, pad_token_id=pad, eos_token_id=None)
    return out, model.model.rope_deltas.clone()


# Newer Transformers (5.24) run the vision encoder inside generate() before the prefill and pop pixel_values and
# the grids from the model kwargs (GenerationMixin._prepare_multimodal_encoder_kwargs_for_generation): the prefill
# then gets mm_encoder_outputs and 4-row position_ids instead. 5.17.0 passes pixels and grids through.
@pytest.mark.parametrize("with_prepare", [True, False], ids=["prepare", "no_prepare"])
@pytest.mark.parametrize("pair", ATTNS, indirect=True)
def test_generate_equals_stock(pair, with_prepare):
    stock, patched = pair
    batch = _generation_batch(stock.config)
    expected, expected_deltas = _generate(stock, batch)
    assert expected.sequences.shape == (2, batch["input_ids"].shape[1] + GENERATE["max_new_tokens"])
    how = "prepare" if with_prepare else "no prepare"
    out, deltas = _generate(patched, syncfree.prepare(batch, None, patched) if with_prepare else batch)
    _assert_same_tensor(out.sequences, expected.sequences, f"generated ids ({how})")
    assert len(out.logits) == len(expected.logits) == GENERATE["max_new_tokens"]
    for step, (got, want) in enumerate(zip(out.logits, expected.logits)):
        _assert_same_tensor(got, want, f"step {step} logits ({how})")
    # The decode steps read the deltas cached at prefill: the same ones stock cached.
    _assert_same_tensor(deltas, expected_deltas, f"rope_deltas after generate ({how})")


@pytest.mark.parametrize("with_prepare", [True, False], ids=["prepare", "no_prepare"])
def test_beam_search_with_several_returned_sequences_equals_stock(dense_sdpa, with_prepare):
    # generate() repeats every row per beam: a prepared plan must be expanded the same way.
    stock, patched = dense_sdpa
    batch = _generation_batch(stock.config)
    options = dict(max_new_tokens=3, do_sample=False, num_beams=2, num_return_sequences=2,
                   pad_token_id=stock.config.text_config.pad_token_id, eos_token_id=None)
    with torch.no_grad():
        expected = stock.generate(**batch, **options)
        got = patched.generate(**(syncfree.prepare(batch, None, patched) if with_prepare else batch), **options)
    assert expected.shape[0] == 4
    _assert_same_tensor(got, expected, "beam search ids")


def _takes_encoder_outputs(model) -> bool:
    return "mm_encoder_outputs" in inspect.signature(type(model.model).forward).parameters


@pytest.mark.parametrize("grids", [True, False], ids=["with_grids", "without_grids"])
@pytest.mark.parametrize("pair", ATTNS, indirect=True)
def test_forward_with_precomputed_encoder_outputs_equals_stock(pair, grids):
    """The forward generate() makes in newer Transformers: features from mm_encoder_outputs, no pixels."""
    stock, patched = pair
    if not _takes_encoder_outputs(stock):
        pytest.skip("this Transformers' forward has no mm_encoder_outputs")
    batch = _inputs(stock.config, "left_padding")
    with torch.no_grad():
        encoded = {"image": stock.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"],
                                                           return_dict=True),
                   "video": stock.model.get_video_features(batch["pixel_values_videos"], batch["video_grid_thw"],
                                                           return_dict=True)}
    kwargs = {k: v for k, v in batch.items() if not k.startswith("pixel_values") and (grids or k not in GRID_KEYS)}
    # Each forward gets its own dict: the forward may fill in the outputs it is handed.
    expected_logits, expected_deltas = _forward(stock, {**kwargs, "mm_encoder_outputs": dict(encoded)},
                                                expect_deltas=grids)
    logits, deltas = _forward(patched, {**kwargs, "mm_encoder_outputs": dict(encoded)}, expect_deltas=grids)
    _assert_same_tensor(logits, expected_logits, "logits (mm_encoder_outputs)")
    if grids:
        _assert_same_tensor(deltas, expected_deltas, "rope_deltas (mm_encoder_outputs)")
    else:  # no grids, no 3D positions: neither model caches deltas
        assert deltas is None and expected_deltas is None


# ---- 5. training -----------------------------------------------------------------------------------------------
def _loss_and_grads(model, batch):
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model.model.rope_deltas = None
    model.zero_grad(set_to_none=True)
    model.train()
    try:
        loss = model(**batch, labels=labels).loss
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    return loss.detach(), grads


@pytest.mark.parametrize("fixture", ["dense_eager", "dense_sdpa", "moe_sdpa"])
def test_training_loss_and_gradients_equal_stock(request, fixture):
    stock, patched = request.getfixturevalue(fixture)
    batch = _inputs(stock.config, "left_padding")
    expected_loss, expected_grads = _loss_and_grads(stock, batch)
    for kwargs, how in ((batch, "no prepare"), (syncfree.prepare(batch, None, patched), "prepare")):
        loss, grads = _loss_and_grads(patched, kwargs)
        _assert_same_tensor(loss, expected_loss, f"loss ({how})")
        assert grads.keys() == expected_grads.keys()
        # The vision tower and the deepstack mergers get gradients too (the features reach the loss).
        assert any(name.startswith("model.visual.deepstack_merger_list") for name in grads)
        different = [name for name in grads if not torch.equal(grads[name], expected_grads[name])]
        assert not different, f"gradients differ from stock ({how}): {different}"


# ---- 6. unpatch ------------------------------------------------------------------------------------------------
PATCHED_ATTRS = ("forward", "get_rope_index", "_deepstack_process")


def test_unpatch_restores_stock(dense_sdpa):
    stock, _ = dense_sdpa
    model = build_model("qwen3-vl-tiny", attn="sdpa")
    assert syncfree.patch(model) is model
    assert syncfree.is_patched(model)
    replaced = {(name, attr) for name, module in model.named_modules() for attr in PATCHED_ATTRS
                if attr in module.__dict__}
    # Every target was replaced on the instance: the model, its text model, the tower and each attention block.
    assert ("model", "forward") in replaced and ("model", "get_rope_index") in replaced
    assert ("model.language_model", "_deepstack_process") in replaced and ("model.visual", "forward") in replaced
    depth = stock.config.vision_config.depth
    assert sum(name.endswith(".attn") and attr == "forward" for name, attr in replaced) == depth

    syncfree.unpatch(model)
    assert not syncfree.is_patched(model)
    for name, module in model.named_modules():
        left = [attr for attr in PATCHED_ATTRS + ("_syncfree_patched",) if attr in module.__dict__]
        assert not left, f"{name or type(module).__name__} still holds instance attributes {left}"
    # The methods resolve to the classes' own (stock) functions again ...
    assert model.model.get_rope_index.__func__ is type(model.model).get_rope_index
    assert model.model.forward.__func__ is type(model.model).forward
    assert model.forward.__func__ is type(model).forward
    assert model.model.visual.forward.__func__ is type(model.model.visual).forward
    # ... and the numbers are stock's.
    batch = _inputs(stock.config, "left_padding")
    expected_logits, expected_deltas = _forward(stock, batch)
    logits, deltas = _forward(model, batch)
    _assert_same_tensor(logits, expected_logits, "logits after unpatch")
    _assert_same_tensor(deltas, expected_deltas, "rope_deltas after unpatch")
