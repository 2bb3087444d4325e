"""The conformance suite: what every fully supported family must show, parametrised over the family table.

For each registered family whose code the installed Transformers ships, on its tiny random-weight preset
(``families.tiny_preset``) and batches laid out by its own processor rules (``syncfree.inputs.processor_batch``, the
family group's ``processor_batch``) over the standard layouts (``family_checks.standard_layouts``; the audio-only
families: clips of several lengths):

* parity: stock's logits from the patched model, without and with ``prepare()``, SDPA and eager, left and right
  padding (eager in the slow step, except the Qwen-VL families');
* prepared syncs: no sync and no blocking copy on the emulated device with ``prepare()``, one sync without it (a MoE
  family in bf16);
* a plan made in a ``DataLoader`` worker (``prepare(batch)``, pickled) gives stock's logits;
* ``generate()`` and training, on images and on videos (clips): stock's ids (greedy, with and without ``prepare()``;
  the static cache; beams returning several sequences: stock's ids or stock's own error), stock's loss and every
  gradient bit for bit;
* training with gradient checkpointing, reentrant and not (the recompute runs after the forward's plan is gone: the
  MoE rows of ERNIE-4.5-VL, the indexed layers' counts of Qwen4-Exp): stock's loss and gradients, or stock's error;
* a placeholder too few: stock's exception, word for word (``prepare()``: stock's words first).

The whole forward as one graph (``torch.compile(fullgraph=True)``) is ``test_one_graph.py``, parametrised over the same
table by ``Layout.one_graph``. A family's own test file keeps only what is specific to it (its rotary index against
stock, its own layouts and pieces, Transformers-release differences).

A layout a family's model cannot take (``InputsNotTaken``, raised by its processor rules: images and videos together
in GLM-4.1V, videos in an image-only family) is skipped for that family, with that message.
"""

from __future__ import annotations

import functools
import pickle

import pytest
import torch

import syncfree
from family_checks import (
    check_checkpointed_training_equals_stock,
    check_forward_equals_stock,
    check_generate_and_backward_equal_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    shipped_types,
    standard_layouts,
)
from syncfree.families import PRESETS, tiny_preset
from syncfree.inputs import Audio, Image, Text, Video, processor_batch
from syncfree.plan.errors import InputsNotTaken
from syncfree.plan.spec import ModelSpec

TYPES = shipped_types()

# The layouts of a family without a vision tower (an audio encoder before the text model): one clip per row.
AUDIO_LAYOUTS = {
    "one clip": [[Text(4), Audio(250), Text(3)]],
    "clips of different lengths": [[Text(3), Audio(517), Text(2)], [Text(5), Audio(130), Text(4)]],
}
# The batch of the prepared-sync and pickling checks: rows of different lengths (padding), several items, the first
# layout of these the family's model takes.
_SEVERAL_ITEMS = ("padding and a text-only row", "images with padding", "images of different sizes",
                  "clips of different lengths")


def _has_vision(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def _layouts(config) -> dict:
    """The standard layouts in pixels that are multiples of the family's patch x merge (the plan's merge on a side;
    2 where the merge comes per item); an audio-only family's clips."""
    return standard_layouts(_unit(config)) if _has_vision(config) else AUDIO_LAYOUTS


def _unit(config) -> int:
    """Pixels per merged token on a side: the patch times the plan's merge (2 where the merge comes per item)."""
    spec = ModelSpec.from_config(config)
    return spec.patch_size * max(spec.spatial_merge_size, 2)


def _layout_names(model_type: str) -> list[str]:
    """Read from the preset's config values (no model built at collection)."""
    has_vision = "vision_config" in PRESETS[tiny_preset(model_type)].values
    return list(standard_layouts(1) if has_vision else AUDIO_LAYOUTS)


def _batch(config, layout: str, padding: str = "left", dtype=None) -> dict:
    try:
        batch = processor_batch(config, _layouts(config)[layout], padding_side=padding)
    except InputsNotTaken as err:
        pytest.skip(str(err))
    return _cast(batch, dtype)


def _cast(batch: dict, dtype) -> dict:
    """Pixels and audio features in the model's dtype, as a user casts them."""
    if dtype is None:
        return batch
    return {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in batch.items()}


def _pair(model_type: str, attn: str = "sdpa", dtype=torch.float32):
    return model_pair(tiny_preset(model_type), attn, dtype)


def _parity_params():
    for t in TYPES:
        for attn in ("sdpa", "eager"):
            # (eager in the slow step, except the Qwen-VL families')
            marks = [pytest.mark.slow] if attn == "eager" and not t.startswith("qwen") else []
            for layout in _layout_names(t):
                yield pytest.param(t, attn, layout, id=f"{t}-{attn}-{layout}", marks=marks)


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize(("model_type", "attn", "layout"), list(_parity_params()))
def test_forward_equals_stock(model_type, attn, layout, padding):
    stock, patched = _pair(model_type, attn)
    check_forward_equals_stock(stock, patched, _batch(stock.config, layout, padding))


def _several_items(config, dtype=None) -> dict:
    layouts = _layouts(config)
    if _has_vision(config):  # (images only, a padded row each: for image-only families)
        u = _unit(config)
        layouts = {**layouts, "images with padding": [[Text(2), Image(2 * u, 3 * u), Text(5)], [Text(1), Image(u, u)]]}
    refused = None
    for name in _SEVERAL_ITEMS:
        if name not in layouts:
            continue
        try:
            batch = processor_batch(config, layouts[name])
        except InputsNotTaken as err:
            refused = err
            continue
        return _cast(batch, dtype)
    pytest.skip(str(refused))


@pytest.mark.parametrize("model_type", TYPES)
def test_a_plan_made_in_a_dataloader_worker_pickles_and_gives_stocks_logits(model_type):
    """``prepare(batch)`` without a device, as a ``DataLoader`` worker runs it: the batch and its plan (the family's
    hooks travel with its spec) cross a process boundary by pickle, and the forward takes them as they arrive."""
    stock, patched = _pair(model_type)
    batch = _several_items(stock.config)
    arrived = pickle.loads(pickle.dumps(syncfree.prepare(batch, None, patched)))
    with torch.no_grad():
        assert torch.equal(patched(**arrived).logits, stock(**batch).logits)


def _has_experts(model_type: str) -> bool:
    return any("Experts" in type(m).__name__ for m in _pair(model_type)[0].modules())


@pytest.mark.parametrize("model_type", TYPES)
def test_prepared_forward_is_sync_and_copy_free_and_one_sync_without_prepare(model_type):
    """A MoE family in bf16, where its experts take PyTorch's grouped matmul (fp32's fallback loop reads the routing:
    the MoE remainder, which each MoE family's own file counts); the others in fp32."""
    dtype = torch.bfloat16 if _has_experts(model_type) else torch.float32
    stock, patched = _pair(model_type, dtype=dtype)
    batch = _several_items(stock.config, dtype)
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch)



@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("model_type", TYPES)
def test_training_with_gradient_checkpointing_equals_stock(model_type, reentrant):
    stock, patched = _pair(model_type)
    check_checkpointed_training_equals_stock(stock, patched, _several_items(stock.config), reentrant)

# Processor outputs no forward reads, which stock generate() refuses ("model_kwargs are not used by the model"): left
# out, as a user must (the video processors' chunk count).
_NOT_FOR_GENERATE = ("num_chunks_per_video",)


def _generate_samples(config, kind: str) -> list[list]:
    """Two rows of different lengths (left padding) with several items of ``kind``; the tokens go past one
    placeholder run, so the decode steps' positions follow a multimodal prompt."""
    if kind == "clips":
        return AUDIO_LAYOUTS["clips of different lengths"]
    u = _unit(config)
    if kind == "images":
        return [[Text(2), Image(4 * u, 2 * u), Text(2), Image(2 * u, 2 * u), Text(1)], [Text(1), Image(2 * u, 2 * u), Text(2)]]
    return [[Text(2), Video(4, 2 * u, 2 * u), Text(1)], [Text(1), Video(2, 2 * u, 3 * u), Text(2)]]


# The heaviest tiny models (about 30 s a batch on two cores): in the slow step.
_SLOW_GENERATE = {"glm5_next"}


def _generate_params():
    for t in TYPES:
        marks = [pytest.mark.slow] if t in _SLOW_GENERATE else []
        kinds = ("images", "videos") if "vision_config" in PRESETS[tiny_preset(t)].values else ("clips",)
        for kind in kinds:
            yield pytest.param(t, kind, id=f"{t}-{kind}", marks=marks)


@pytest.mark.parametrize(("model_type", "kind"), list(_generate_params()))
def test_generate_and_training_step_equal_stock(model_type, kind):
    """Greedy ids with and without prepare(), the loss and every gradient; then a prepared batch with the static cache,
    and with beams returning several sequences (stock's ids, or stock's own error)."""
    stock, patched = _pair(model_type)
    try:
        batch = processor_batch(stock.config, _generate_samples(stock.config, kind))
    except InputsNotTaken as err:
        pytest.skip(str(err))
    batch = {k: v for k, v in batch.items() if k not in _NOT_FOR_GENERATE}
    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    for extra in (dict(cache_implementation="static"), dict(num_beams=2, num_return_sequences=2)):
        mode = {**options, **extra}
        with torch.no_grad():
            _same_ids_or_same_error(functools.partial(stock.generate, **batch, **mode),
                                    functools.partial(patched.generate, **syncfree.prepare(batch, None, patched), **mode))


def _same_ids_or_same_error(run_stock, run_patched) -> None:
    """Stock's ids from the patched model; where stock's own generate() fails (beams over videos in several
    families), the same exception with the same message."""
    try:
        expected = run_stock()
    except Exception as err:  # (whatever stock raises, the patched model must raise it too)
        with pytest.raises(type(err)) as raised:
            run_patched()
        assert str(raised.value) == str(err)
        return
    assert torch.equal(run_patched(), expected)



def _outcome(run):
    try:
        return run(), None
    except Exception as err:  # (whatever stock raises, the patched model must raise it too)
        return None, err


@pytest.mark.parametrize("model_type", TYPES)
def test_a_missing_placeholder_gets_stocks_error_with_and_without_prepare(model_type):
    """The image (clip) with its last placeholder replaced by a text token: the patched model, given the batch as it
    is, raises stock's exception word for word (or, where stock takes the batch, gives stock's logits); ``prepare()``
    refuses it with the same type and stock's words first (then what it knows of the items)."""
    stock, patched = _pair(model_type)
    config = stock.config
    batch = processor_batch(config, _layouts(config)["one image" if _has_vision(config) else "one clip"])
    token = getattr(config, "image_token_id" if _has_vision(config) else "audio_token_id", None)
    ids = batch["input_ids"].clone()
    where = (ids == token).nonzero()
    assert len(where) > 1, f"{model_type}: no placeholders of token {token} in its one-item layout"
    ids[tuple(where[-1])] = ids[0, 0]  # (the row's first token: text)
    batch = {**batch, "input_ids": ids}
    if "mm_token_type_ids" in batch:  # (marked text there too, as a processor would: the batch agrees with itself)
        batch["mm_token_type_ids"] = batch["mm_token_type_ids"].clone()
        batch["mm_token_type_ids"][tuple(where[-1])] = 0
    with torch.no_grad():
        expected, stock_error = _outcome(lambda: stock(**batch).logits)
        got, patched_error = _outcome(lambda: patched(**batch).logits)
        prepared, prepare_error = _outcome(lambda: patched(**syncfree.prepare(batch, None, patched)).logits)
    if stock_error is None:
        assert patched_error is None and prepare_error is None and torch.equal(got, expected)
        assert torch.equal(prepared, expected)
        return
    assert type(patched_error) is type(stock_error) and str(patched_error) == str(stock_error)
    assert type(prepare_error) is type(stock_error) and str(prepare_error).startswith(str(stock_error))

def test_every_registered_family_has_a_tiny_preset_and_takes_a_standard_layout():
    """The suite reaches every family: each has its tiny preset, and its processor rules take at least the one-item
    layout (an image, or a clip)."""
    for model_type in TYPES:
        config = _pair(model_type)[0].config
        layout = "one image" if _has_vision(config) else "one clip"
        assert isinstance(processor_batch(config, _layouts(config)[layout])["input_ids"], torch.Tensor), model_type
