"""GLM-Image: an autoregressive image generator whose grids hold the images it generates (``images_per_sample`` splits
them per sample), whose source images' VQ codes are written into ``input_ids``, and whose own rotary index leaves the
decode steps' positions on the model. Parity with stock over the processor's layouts (image-to-image and
text-to-image), the plan's positions against the family's stock index, no syncs and no blocking copies with prepare(),
generate (dynamic, static and beams), gradients, compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import (
    check_generate_and_backward_equal_stock,
    check_generate_modes_equal_stock,
    check_prepared_prefill_is_sync_and_copy_free,
    model_pair,
    tower_graph_breaks,
    traced_copy,
)
from syncfree.families.glm_image import installed_code_supported
from syncfree.inputs import Image, Text, Video, processor_batch
from syncfree.plan.errors import InputsNotTaken

# (Skipped only where the installed Transformers ships other GLM-Image code than syncfree was written for, 5.17's.)
pytestmark = pytest.mark.skipif(not installed_code_supported(),
                                reason="this Transformers release has no GLM-Image syncfree was written for (5.24's)")
NAME = "glm-image-tiny"


def _pair(attn: str = "sdpa"):
    return model_pair(NAME, attn)


def _inputs(config, samples, padding_side="left", seed=0, target=(1152, 768)):
    from syncfree.families.glm_image import build_glm_image_inputs

    return build_glm_image_inputs(config, samples, padding_side=padding_side, seed=seed, target=target)


# Pixels are multiples of 16 (patch 16, no merge). Image-to-image prompts have the same number of source images each
# (the processor refuses others); text-to-image prompts have none.
U = 16
LAYOUTS = {
    "one image": [[Text(4), Image(3 * U, 4 * U), Text(3)]],
    "images of different sizes": [[Text(2), Image(U, 2 * U), Text(1), Image(4 * U, U), Text(1), Image(U, U),
                                   Text(2)]],
    "images first and last": [[Image(2 * U, U), Text(3), Image(U, 3 * U)]],
    "two prompts with padding": [[Text(2), Image(2 * U, 3 * U), Text(5)], [Text(1), Image(U, U), Text(1)]],
    "text to image with padding": [[Text(4)], [Text(9)], [Text(1)]],
}


def _decode_state(model):
    return model.model._cached_decode_position_ids, model.model._prefill_len


def test_the_processor_layout():
    """A source image is its start id, t*h*w placeholders, its end id; the prompt ends with the target size as text and
    the start id; image_grid_thw lists each sample's sources then its target grids (1, or 2 without images)."""
    config = _pair()[0].config
    batch = processor_batch(config, [[Text(2), Image(2 * U, 3 * U), Text(1)]])
    assert set(batch) == {"input_ids", "attention_mask", "pixel_values", "image_grid_thw", "images_per_sample"}
    ids, image = batch["input_ids"][0].tolist(), config.image_token_id
    assert ids[2:2 + 8] == [config.image_start_token_id] + [image] * 6 + [config.image_end_token_id]
    size = [image + 1, image + 4 + 3, image + 4 + 6, image + 3, image + 4 + 2, image + 4 + 4, image + 2]  # "36 24"
    assert ids[-8:] == size + [config.image_start_token_id]
    assert batch["image_grid_thw"].tolist() == [[1, 2, 3], [1, 36, 24]] and batch["images_per_sample"].tolist() == [2]
    assert tuple(batch["pixel_values"].shape) == (6, 3 * 16 * 16)
    text_only = processor_batch(config, [[Text(3)], [Text(1)]])
    assert "pixel_values" not in text_only and text_only["images_per_sample"].tolist() == [2, 2]
    assert text_only["image_grid_thw"].tolist() == [[1, 36, 24], [1, 19, 13]] * 2
    with pytest.raises(InputsNotTaken, match="same number of source images"):
        processor_batch(config, [[Text(2), Image(U, U)], [Text(3)]])
    with pytest.raises(InputsNotTaken, match="images and text only"):
        processor_batch(config, [[Text(2), Video(2, U, U)]])


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_and_decode_positions_equal_stock(attn, layout, padding):
    """Stock's logits without and with prepare(), and what stock's index leaves on the model: deltas, decode positions
    (a tensor of stock's dtype and shape) and the prompt length."""
    stock, patched = _pair(attn)
    batch = _inputs(stock.config, LAYOUTS[layout], padding)
    with torch.no_grad():
        expected = stock(**batch).logits
        state = _decode_state(stock)
        assert not expected.isnan().any()
        for inputs in (batch, syncfree.prepare(batch, None, patched)):
            assert torch.equal(patched(**inputs).logits, expected)
            assert torch.equal(patched.model.rope_deltas, stock.model.rope_deltas)
            got = _decode_state(patched)
            assert got[1] == state[1] and got[0].dtype == state[0].dtype and torch.equal(got[0], state[0])


@st.composite
def _batches(draw):
    side = st.integers(1, 4).map(lambda n: U * n)
    images = draw(st.integers(0, 2))
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        items = [Image(draw(side), draw(side)) for _ in range(images)] + [Text(draw(st.integers(1, 4)))
                                                                          for _ in range(draw(st.integers(0, 3)))]
        rows.append(draw(st.permutations(items)) or [Text(1)])
    target = (32 * draw(st.integers(1, 6)), 32 * draw(st.integers(1, 6)))
    return rows, target


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=_batches(), left=st.booleans(), seed=st.integers(0, 2**16))
def test_the_plans_positions_are_the_familys_stock_index(drawn, left, seed):
    """The plan's positions and decode positions (stock's index run on the host copies), the patched index without a
    plan and on a prepared batch (its plan's) against stock's index on the batch: every axis, row, delta and step."""
    rows, target = drawn
    stock, patched = _pair()
    batch = _inputs(stock.config, rows, "left" if left else "right", seed, target)
    args = {k: batch[k] for k in ("input_ids", "image_grid_thw", "images_per_sample", "attention_mask")}
    want = (*stock.model.get_rope_index(**args), *_decode_state(stock))
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"]
    prepared = syncfree.prepare(batch, "cpu", patched)  # (registered: the index answers from its plan)
    found = [(plan.position_ids, plan.rope_deltas, plan.decode_position_ids, plan.prefill_len)]
    for inputs in (args, {k: prepared[k] for k in args}):
        found.append((*patched.model.get_rope_index(**inputs), *_decode_state(patched)))
    for got in found:
        assert got[3] == want[3]
        for g, w in zip(got[:3], want[:3]):
            assert g.dtype == w.dtype and torch.equal(g, w)


def test_the_placeholder_check_raises_stocks_error():
    """A placeholder short: stock's ValueError and message, from the plan's count (no device sum read); prepare() says
    the same."""
    stock, patched = _pair()
    batch = _inputs(stock.config, LAYOUTS["one image"])
    ids = batch["input_ids"]
    ids[0, (ids[0] == stock.config.image_token_id).nonzero()[5, 0]] = 7
    errors = []
    for model in (stock, patched):
        with pytest.raises(ValueError) as raised, torch.no_grad():
            model(**batch)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and errors[0].startswith("Number of image placeholder tokens (11) does not match")
    with pytest.raises(ValueError) as raised:  # prepare(): stock's words, then the grids' sources
        syncfree.prepare(batch, None, patched)
    assert str(raised.value) == errors[0] + " (image_grid_thw describes 1 images of [12] tokens)"


@pytest.mark.parametrize("layout", ["two prompts with padding", "text to image with padding"])
def test_prepared_prefill_has_no_sync_and_no_blocking_copy(layout):
    stock, patched = _pair()
    check_prepared_prefill_is_sync_and_copy_free(stock, patched, processor_batch(stock.config, LAYOUTS[layout]))


def test_generate_and_backward_equal_stock_text_to_image():
    """Generated image tokens (the decode steps slice the decode positions the plan's index left), dynamic and static
    cache and beams; the loss and every gradient."""
    stock, patched = _pair()
    batch = _inputs(stock.config, LAYOUTS["text to image with padding"])
    options = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    check_generate_modes_equal_stock(stock, patched, batch, options)


def test_generate_and_backward_equal_stock_image_to_image():
    """The same with source images (encoded once, before the prefill), dynamic and static cache. Beams: stock's
    generate() cannot expand GLM-Image's per-image features (its split list has one entry per channel row), and raises;
    the patched model raises the same."""
    stock, patched = _pair()
    batch = _inputs(stock.config, LAYOUTS["two prompts with padding"])
    options = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    check_generate_and_backward_equal_stock(stock, patched, batch, options, syncfree.prepare(batch, None, patched))
    with torch.no_grad():
        static = dict(options, cache_implementation="static")
        assert torch.equal(patched.generate(**syncfree.prepare(batch, None, patched), **static),
                           stock.generate(**batch, **static))
        errors = []
        for model, inputs in ((stock, batch), (patched, syncfree.prepare(batch, None, patched))):
            with pytest.raises(ValueError) as raised:
                model.generate(**inputs, **options, num_beams=2, num_return_sequences=2)
            errors.append(str(raised.value))
    assert errors[0] == errors[1] == "torch.cat(): expected a non-empty list of Tensors"


def test_the_patched_tower_breaks_the_graph_no_more_than_stock():
    """The tower is handed the plan's tables and its grid on the device: under torch.compile it breaks the graph no
    more often than stock's tower on the same grid (stock's own host loops over the grid)."""
    stock, patched = _pair()
    batch = processor_batch(patched.config, [[Image(96, 128), Image(64, 32)]])
    explained = tower_graph_breaks(patched, patched.model.visual, batch)
    grid = syncfree.prepare(batch, None, patched)["syncfree_plan"].image.grid_thw
    stock_explained = torch._dynamo.explain(traced_copy(stock.model.visual))(batch["pixel_values"], grid_thw=grid)
    assert explained.graph_break_count <= stock_explained.graph_break_count


@pytest.mark.parametrize("scope", ["rope", "vision", "full"])
def test_the_audit_scopes(scope):
    """``syncfree audit --scope``: the index alone and the tower alone (handed the sources, as the forward hands them),
    and the whole forward: stock's syncs, none with prepare(). Without prepare() the tower alone waits twice: its
    caller's split of the sources reads images_per_sample on the device (stock's own method, as stock's forward calls
    it; the patched forward hands it the host copy), then the tower's one read of its grid."""
    from syncfree.compare.forward import AuditSpec, run_compare

    reports, _ = run_compare(AuditSpec(model=NAME, inputs="images", scope=scope), "emulated")
    assert len(reports["stock"].syncs) > 0 and len(reports["patched+prepare"].syncs) == 0
    assert len(reports["patched"].syncs) <= (2 if scope == "vision" else 1)


_EDITS = st.one_of(st.just([]), st.lists(st.tuples(
    st.sampled_from(["drop", "insert", "replace"]), st.integers(0, 10**6),
    st.sampled_from(["text", "image_start", "image_end", "image", "empty_image"])), min_size=1, max_size=3))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=_batches(), left=st.booleans(), seed=st.integers(0, 2**16), edits=_EDITS, per_sample=st.booleans(),
       masked=st.booleans())
def test_the_numpy_index_is_stocks(drawn, left, seed, edits, per_sample, masked):
    """The plan's NumPy index (``families/glm_image/rope``) against stock's own ``get_rope_index`` run on the same host
    tensors: positions, deltas, the decode positions it leaves on the model and the prefill length, over random
    layouts (source images or none, either padding, with and without a mask or ``images_per_sample``) and the same
    with a few ids dropped, inserted or replaced. Where it answers, every value is stock's; where it does not, the plan
    runs stock's index. The processor's own layouts it must answer."""
    from syncfree.families.glm_image.rope import grid_rope_numpy
    from syncfree.plan.rope_stock import stock_on_host
    from syncfree.plan.spec import ModelSpec

    rows, target = drawn
    config = _pair()[0].config
    spec = ModelSpec.from_config(config)
    batch = _inputs(config, rows, "left" if left else "right", seed, target)
    if edits:
        ids, mask = batch["input_ids"][0].tolist(), batch["attention_mask"][0].tolist()
        row = [i for i, m in zip(ids, mask) if m]
        token = {"text": 7, "image_start": config.image_start_token_id, "image_end": config.image_end_token_id,
                 "image": config.image_token_id}
        for op, at, what in edits:
            at = at % (len(row) + 1)
            if op == "drop" and at < len(row) and len(row) > 1:
                del row[at]
            elif op == "insert" and what == "empty_image":  # (an image with no tokens: one more pair than grids)
                row[at:at] = [config.image_start_token_id, config.image_end_token_id]
            elif op == "insert":
                row.insert(at, token[what])
            elif op == "replace" and at < len(row) and what != "empty_image":
                row[at] = token[what]
        width = max(len(row), batch["input_ids"].shape[1])
        for name, first in (("input_ids", row), ("attention_mask", [1] * len(row))):
            full = [first] + [batch[name][r].tolist() for r in range(1, batch[name].shape[0])]
            full = [([0] * (width - len(r)) + r) if left else (r + [0] * (width - len(r))) for r in full]
            batch[name] = torch.tensor(full, dtype=torch.long)
    host = {n: batch.get(n) for n in ("input_ids", "image_grid_thw", "images_per_sample", "attention_mask")}
    if not per_sample:
        host["images_per_sample"] = None
    if not masked and bool(batch["attention_mask"].all()):
        host["attention_mask"] = None
    got = grid_rope_numpy(spec, host)
    if not edits and (per_sample or batch["input_ids"].shape[0] == 1):
        assert got is not None  # (the processor's layouts: never left to stock's walk)
    if got is None:
        return
    (positions, deltas), model = stock_on_host(spec.vision_module, spec.rope.host_class, config, "get_rope_index",
                                               **host)
    want = dict(position_ids=positions, rope_deltas=deltas, decode_position_ids=model._cached_decode_position_ids,
                prefill_len=model._prefill_len)
    assert got["prefill_len"] == want["prefill_len"]
    for name in ("position_ids", "rope_deltas", "decode_position_ids"):
        g, w = got[name], want[name]
        assert (g is None) == (w is None)
        if w is not None:
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


@pytest.mark.parametrize("layout", ["one image", "images of different sizes", "two prompts with padding"])
def test_the_vq_codes_operator_gives_stocks_codes(layout):
    """``codes_op`` (a stream's graph encodes the source images in one operator): stock's ``get_image_tokens`` loop,
    the same codes, for images of any sides (one of a single patch among them)."""
    from syncfree.families.glm_image.codes_op import image_codes

    stock, _ = _pair()
    batch = _inputs(stock.config, LAYOUTS[layout])
    model = stock.model
    with torch.no_grad():
        sources = model.get_image_grids_for_generation(batch["images_per_sample"], batch["image_grid_thw"])
        features = model.get_image_features(batch["pixel_values"], sources).pooler_output
        assert torch.equal(image_codes(model.vqmodel, features), model.get_image_tokens(features))


def test_a_stream_keeps_one_source_image_per_sample():
    """``stream_batch``: GLM-Image's graph is per number of source images, so its stream keeps one per sample (a
    sample's first, or the batch's first image where it has none); a batch without any image stays text-to-image."""
    from syncfree.inputs import stream_batch

    stock, _ = _pair()
    samples = [[Text(2), Image(U, 2 * U), Text(1), Image(2 * U, U), Text(2)], [Text(3)]]
    batch = stream_batch(stock.config, samples)
    assert batch["images_per_sample"].tolist() == [2, 2]  # (a source and a target each)
    assert batch["image_grid_thw"][[0, 2], 1:].tolist() == [[1, 2], [1, 2]]  # (the first image, in both)
    text_only = stream_batch(stock.config, [[Text(2)], [Text(4)]])
    assert "pixel_values" not in text_only
