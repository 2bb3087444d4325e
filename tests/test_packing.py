"""Padding-free packed batches (``syncfree.packing_collator``): each sample's logits in a packed row are those of the
sample run alone, the loss is the padded batch's, bad samples are named, and every family either packs correctly or
is refused in one line.

Stock attends across the samples of a packed row (its 3D positions alone carry no boundary, and with a cache its mask
code skips the packed check): ``test_stock_attends_across_samples`` shows the leak the patched forward closes.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import shipped_types
from syncfree.families import FAMILIES, processor_batch, tiny_preset
from syncfree.inputs import Image, Text, Video
from syncfree.patching import packing_refusal
from syncfree.plan.errors import InputsNotTaken
from syncfree.plan.packing import packing_of, rows_of
from syncfree.presets import build_model, load_config

# Families whose patched forward keeps packed samples apart (their layouts say so); every other one is refused.
SHIPPED = set(shipped_types())  # (the families this Transformers release has)
# (the families the collator packs for: those whose forward keeps packed samples apart, less those with an audio
# encoder, whose audio the collator lays out no way; they take batches packed elsewhere, tested below)
PACKING = sorted(t for t, f in FAMILIES.items() if not f.layout.packing_refused and not f.layout.audio.encoder
                 and t in SHIPPED)
TOLERANCE = 1e-5  # fp32, absolute: the packed row's masked attention against the sample's own causal one


def _unit(config) -> int:
    return config.vision_config.patch_size * 2


def _samples(config) -> list[list]:
    """Images of several sizes, a video, text-only samples (a family that takes no image and video in one batch gets
    two images for its video: its videos are packed apart, ``_video_samples``)."""
    u = _unit(config)
    video = [Text(3), Video(4, 2 * u, u), Text(2)]
    if not _takes_videos_with_images(config):
        video = [Text(3), Image(2 * u, 4 * u), Text(2)]
    return [[Text(5), Image(2 * u, 2 * u), Text(3)], [Text(7)],
            [Text(4), Image(u, 3 * u), Text(6), Image(u, u), Text(2)], video, [Text(9)],
            [Text(2), Image(3 * u, u), Text(1)]]


def _takes_videos(config) -> bool:
    try:
        processor_batch(config, [[Text(2), Video(2, _unit(config), _unit(config)), Text(2)]])
    except InputsNotTaken:
        return False
    return True


def _takes_videos_with_images(config) -> bool:
    """Whether the family's forward takes a batch holding images and videos (GLM's counts frames as images)."""
    return _takes_videos(config) and not FAMILIES[config.model_type].layout.video.frames_as_images


def _video_samples(config) -> list[list]:
    u = _unit(config)
    return [[Text(3), Video(4, 2 * u, u), Text(2)], [Text(6)], [Text(2), Video(2, u, 2 * u), Text(4)]]


@pytest.fixture(scope="module", params=PACKING)
def family(request):
    model = build_model(tiny_preset(request.param)).eval()
    return request.param, model


def _alone(model, samples: list[dict]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(**s).logits[0] for s in samples]


def _worst(packed: torch.Tensor, batch: dict, alone: list[torch.Tensor]) -> float:
    packing = batch["syncfree_plan"].packing
    return max((packed[r, start:start + n] - alone[i]).abs().max().item()
               for (r, start, n), i in zip(packing.spans(), packing.order))


@pytest.mark.parametrize("use_cache", [False, True])
def test_each_sample_in_a_packed_batch_gets_its_own_logits(family, use_cache):
    name, model = family
    layouts = [_samples(model.config)]
    if _takes_videos(model.config) and not _takes_videos_with_images(model.config):
        layouts.append(_video_samples(model.config))  # (its videos packed apart from images)
    for layout in layouts:
        samples = [processor_batch(model.config, [s]) for s in layout]
        alone = _alone(syncfree.unpatch(model) or model, samples)
        syncfree.patch(model)
        try:
            longest = max(s["input_ids"].shape[1] for s in samples)
            batch = syncfree.packing_collator(model, max_tokens=longest + 8)(samples)
            assert batch["input_ids"].shape[0] > 1  # (several rows, the last ones padded)
            with torch.no_grad():
                packed = model(**{**batch, "use_cache": use_cache}).logits
        finally:
            syncfree.unpatch(model)
        assert _worst(packed, batch, alone) <= TOLERANCE


def _text_model_takes_a_text_row(model) -> bool:
    """Whether the stock text model runs on 4-row positions (a text row, then the 3D rows), as a packed batch has them:
    an older Cosmos3-Edge's rotates by 3 rows only and fails on 4."""
    text = model.model.language_model
    embeds = torch.zeros(1, 3, text.config.hidden_size)
    try:
        with torch.no_grad():
            text(inputs_embeds=embeds, position_ids=torch.arange(3).expand(4, 1, 3))
    except RuntimeError:
        return False
    return True


def test_cosmos3_edge_packs_where_its_text_model_takes_a_text_row_and_is_refused_elsewhere():
    """The installed Cosmos3-Edge text model decides: where it takes 4-row positions, each packed sample gets its own
    logits; where it takes 3 rows only, packing is refused in one line naming the family and why (never a shape
    error from inside the forward)."""
    if "cosmos3_edge" not in SHIPPED:
        pytest.skip("this Transformers release has no Cosmos3-Edge")
    model = build_model(tiny_preset("cosmos3_edge")).eval()
    samples = [processor_batch(model.config, [s]) for s in _samples(model.config)[:3]]
    takes = _text_model_takes_a_text_row(model)
    alone = _alone(model, samples) if takes else None
    syncfree.patch(model)
    try:
        if not takes:
            refused = r"refuses packed batches for cosmos3_edge: .*3-row position_ids"
            with pytest.raises(ValueError, match=refused) as err:
                syncfree.packing_collator(model, max_tokens=64)
            assert "\n" not in str(err.value)
            # (a packed batch made elsewhere: 4-row positions whose text row restarts per sample)
            text = syncfree.packing_collator(load_config("qwen2-vl-tiny"), max_tokens=64)(
                [{"input_ids": torch.randint(1, 900, (1, n))} for n in (5, 9, 3)])
            text.pop("syncfree_plan")
            with pytest.raises(ValueError, match=refused):
                syncfree.prepare(text, "cpu", model)
            assert "cosmos3_edge" not in PACKING
            return
        assert "cosmos3_edge" in PACKING  # (the parity test above runs it on every layout)
        batch = syncfree.packing_collator(model, max_tokens=64)(samples)
        with torch.no_grad():
            packed = model(**batch).logits
    finally:
        syncfree.unpatch(model)
    assert _worst(packed, batch, alone) <= TOLERANCE


def test_stock_attends_across_samples():
    model = build_model("qwen2.5-vl-tiny").eval()
    samples = [processor_batch(model.config, [s]) for s in _samples(model.config)[:3]]
    alone = _alone(model, samples)
    syncfree.patch(model)
    batch = syncfree.packing_collator(model, max_tokens=200)(samples)
    syncfree.unpatch(model)
    stock = {k: v for k, v in batch.items() if k != "syncfree_plan"}
    with torch.no_grad():  # (stock, with a cache: its mask code does not look for packed rows)
        leaked = model(**{**stock, "use_cache": True}).logits
        kept = model(**stock).logits  # (the batch's use_cache=False: stock's own packed masks, one sync)
    assert _worst(leaked, batch, alone) > 1e-2
    assert _worst(kept, batch, alone) <= TOLERANCE


def test_labels_and_loss_equal_the_padded_batchs():
    model = build_model("qwen2.5-vl-tiny").eval()
    layout = _samples(model.config)
    samples = [processor_batch(model.config, [s]) for s in layout]
    for s in samples:
        s["labels"] = s["input_ids"].clone()
    padded = _padded(samples)
    with torch.no_grad():
        expected = model(**padded).loss
    syncfree.patch(model)
    before = [{k: v.clone() for k, v in s.items()} for s in samples]
    batch = syncfree.packing_collator(model, max_tokens=48)(samples)
    for s, kept in zip(samples, before):  # (the samples are not edited)
        assert all(torch.equal(s[k], v) for k, v in kept.items())
    labels, packing = batch["labels"], batch["syncfree_plan"].packing
    for (r, start, n), i in zip(packing.spans(), packing.order):
        assert labels[r, start] == -100
        assert torch.equal(labels[r, start + 1:start + n], samples[i]["labels"][0, 1:])
    pad = [(r, sum(lengths) - p) for r, (lengths, p) in enumerate(zip(packing.rows, packing.padding)) if p]
    assert pad and all((labels[r, start:] == -100).all() for r, start in pad)
    assert int((labels != -100).sum()) == int((padded["labels"][:, 1:] != -100).sum())
    with torch.no_grad():
        loss = model(**batch).loss
    syncfree.unpatch(model)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)


def _padded(samples: list[dict]) -> dict:
    """The same samples as one right-padded batch of 4-row-free processor layout (a padded collator's)."""
    width = max(s["input_ids"].shape[1] for s in samples)
    batch = {}
    for name, fill in (("input_ids", 0), ("attention_mask", 0), ("mm_token_type_ids", 0), ("labels", -100)):
        batch[name] = torch.cat([torch.nn.functional.pad(s[name], (0, width - s[name].shape[1]), value=fill)
                                 for s in samples])
    for name in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        parts = [s[name] for s in samples if name in s]
        if parts:
            batch[name] = torch.cat(parts)
    return batch


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(40, 120), st.booleans())
@settings(max_examples=200, deadline=None)
def test_rows_and_boundaries(lengths, max_tokens, first_fit):
    rows = rows_of(lengths, max_tokens, first_fit=first_fit)
    order = [i for row in rows for i in row]
    assert sorted(order) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= max_tokens for row in rows)
    assert all(row == sorted(row) for row in rows)
    if not first_fit:  # in the order given; a new row only where the next sample does not fit in the current one
        assert order == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in a) + lengths[b[0]] > max_tokens for a, b in zip(rows, rows[1:]))
    else:  # each sample in the first row with room when it came
        for r, row in enumerate(rows):
            for i in row:
                earlier = [sum(lengths[j] for j in rows[q] if j < i) for q in range(r)]
                assert all(used + lengths[i] > max_tokens for used in earlier)
    width = max(sum(lengths[i] for i in row) for row in rows)
    packing = packing_of([[lengths[i] for i in row] for row in rows], order, width)
    ids = packing.sequence_ids
    assert tuple(ids.shape) == (len(rows), width) and packing.batch_shape == (len(rows), width)
    flat = [n for row in packing.rows for n in row]
    assert torch.equal(torch.diff(packing.cu_seq_lens.long()), torch.tensor(flat))
    assert packing.max_length == max(flat)
    spans = packing.spans()
    assert [n for _, _, n in spans] == [lengths[i] for i in order]
    for r, start, n in spans:  # a sample is one segment of its row, and no other token shares it
        assert (ids[r, start:start + n] == ids[r, start]).all()
        assert int((ids[r] == ids[r, start]).sum()) == n
    assert pickle.loads(pickle.dumps(packing)).rows == packing.rows


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) & SHIPPED))
def test_every_family_packs_or_is_refused_in_one_line(model_type):
    """Refused families name themselves and why; the others are in PACKING, whose parity test runs above."""
    layout = FAMILIES[model_type].layout
    if not layout.packing_refused and not layout.audio.encoder:
        assert model_type in PACKING
        return
    config = load_config(tiny_preset(model_type))
    refusal = packing_refusal(config)
    assert refusal is not None and "\n" not in refusal and model_type in refusal
    with pytest.raises(ValueError, match=model_type):
        syncfree.packing_collator(config, max_tokens=64)


def test_an_unpatched_model_is_refused():
    model = build_model("qwen2-vl-tiny")
    with pytest.raises(ValueError, match="unpatched qwen2_vl model"):
        syncfree.packing_collator(model, max_tokens=64)
    syncfree.patch(model)
    batch = syncfree.packing_collator(model, max_tokens=64)(
        [processor_batch(model.config, [s]) for s in _samples(model.config)[:2]])
    syncfree.unpatch(model)
    with pytest.raises(ValueError, match="unpatched qwen2_vl model"):
        syncfree.prepare(batch, "cpu", model)


def test_generate_refuses_a_packed_batch():
    model = syncfree.patch(build_model("qwen2-vl-tiny"))
    batch = syncfree.packing_collator(model, max_tokens=64)(
        [processor_batch(model.config, [s]) for s in _samples(model.config)[:2]])
    batch.pop("labels")
    batch.pop("use_cache")
    with pytest.raises(ValueError, match="generate"):
        model.generate(**batch, max_new_tokens=2)


# Bad input: one line naming the sample, the samples untouched.
def _qwen25():
    model = syncfree.patch(build_model("qwen2.5-vl-tiny"))
    return model, [processor_batch(model.config, [s]) for s in _samples(model.config)[:3]]


def _expect_refused(collator, samples, pattern: str) -> str:
    kept = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()} for s in samples]
    with pytest.raises(ValueError, match=pattern) as err:
        collator(samples)
    message = str(err.value)
    assert "\n" not in message and message.startswith("syncfree.packing_collator: ")
    for s, before in zip(samples, kept):
        assert s.keys() == before.keys()
        assert all(torch.equal(s[k], v) if isinstance(v, torch.Tensor) else s[k] == v for k, v in before.items()
                   if s[k].device.type != "meta")
    return message


def test_grid_and_placeholders_that_disagree_name_the_sample():
    model, samples = _qwen25()
    collator = syncfree.packing_collator(model, max_tokens=64)
    grid = samples[2]["image_grid_thw"].clone()
    grid[0, 2] += 2  # (one image two patches wider than its placeholders and pixels)
    samples[2] = {**samples[2], "image_grid_thw": grid}
    _expect_refused(collator, samples, r"sample 2: Image features and image tokens do not match")
    samples[2] = {**samples[2], "image_grid_thw": grid - torch.tensor([0, 0, 2])}
    samples[0] = {**samples[0], "pixel_values": samples[0]["pixel_values"][:-4]}
    _expect_refused(collator, samples, r"sample 0: pixel_values has \d+ patches but image_grid_thw describes")


def test_a_sample_on_another_device_is_named():
    model, samples = _qwen25()
    samples[1] = {**samples[1], "input_ids": samples[1]["input_ids"].to("meta")}
    _expect_refused(syncfree.packing_collator(model, max_tokens=64), samples, r"sample 1's input_ids is on meta")


def test_samples_of_another_family_are_named():
    model, samples = _qwen25()
    collator = syncfree.packing_collator(model, max_tokens=64)
    other = build_model("qwen3-vl-tiny").config  # (16-pixel patches: wider pixel rows)
    foreign = processor_batch(other, [[Text(2), Image(64, 64), Text(2)]])
    _expect_refused(collator, [samples[0], foreign], r"sample 1's pixel_values rows have 1536 values but qwen2_5_vl's")
    # The same patches, other placeholder ids (the published configs': the tiny presets share their ids).
    published = load_config("qwen2.5-vl-3b")
    collator = syncfree.packing_collator(published, max_tokens=64)
    ours = processor_batch(published, [[Text(2), Image(56, 56), Text(2)]])
    foreign = processor_batch(load_config("glm4.1v-9b"), [[Text(2), Image(56, 56), Text(2)]])
    _expect_refused(collator, [ours, ours, foreign], r"sample 2: mm_token_type_ids marks \d+ tokens as image")


def test_a_sample_longer_than_max_tokens_is_named():
    model, samples = _qwen25()
    n = samples[2]["input_ids"].shape[1]
    _expect_refused(syncfree.packing_collator(model, max_tokens=n - 1), samples,
             rf"sample 2 has {n} tokens, more than max_tokens={n - 1}")


def test_a_packed_batch_of_another_model_is_refused():
    model, samples = _qwen25()
    batch = syncfree.packing_collator(model, max_tokens=64)(samples)
    other = syncfree.patch(build_model("qwen2-vl-tiny"))
    with pytest.raises(ValueError, match="built for other model values"):
        other(**batch)


def test_the_collator_pickles_and_its_batch_too():
    model, samples = _qwen25()
    collator = pickle.loads(pickle.dumps(syncfree.packing_collator(model, max_tokens=64)))
    batch = pickle.loads(pickle.dumps(collator(samples)))
    with torch.no_grad():
        packed = model(**batch).logits
    syncfree.unpatch(model)
    assert _worst(packed, batch, _alone(model, samples)) <= TOLERANCE


def test_a_prepared_packed_forward_and_training_step_make_no_sync():
    model, samples = _qwen25()
    batch = syncfree.packing_collator(model, max_tokens=64)(samples)
    with torch.no_grad():
        expected = model(**batch).logits
    with syncfree.emulate_cuda():
        model.to("cuda")
        try:
            inputs = syncfree.prepare(batch, "cuda", model)
            with syncfree.audit() as forward, torch.no_grad():
                logits = model(**inputs).logits
            logits = logits.cpu()
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            with syncfree.audit() as step:
                model(**syncfree.prepare(batch, "cuda", model)).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            # (the DataLoader way: the batch with its plan moved as a training loop moves it)
            moved = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            with syncfree.audit() as carried:
                model(**moved).loss.backward()
        finally:
            model.to("cpu").eval()
    assert forward.syncs == [] and not forward.blocking_copies, forward.table()
    assert step.syncs == [] and not step.blocking_copies, step.table()
    assert carried.syncs == [], carried.table()
    assert torch.equal(logits, expected)


def test_another_text_attention_is_refused():
    model, samples = _qwen25()
    batch = syncfree.packing_collator(model, max_tokens=64)(samples)
    model.config.text_config._attn_implementation = "flex_attention"
    try:
        with pytest.raises(ValueError, match="'flex_attention' attention"):
            model(**batch)
    finally:
        model.config.text_config._attn_implementation = "sdpa"


def _flash_standin(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A flash-style attention for the CPU: only the variable-length arguments keep the samples apart (no mask is
    made for it), as in flash attention's ``flash_attn_varlen_func`` over the flattened rows."""
    from syncfree.plan.packing import FLASH_KWARGS

    assert attention_mask is None
    _FLASH_SEEN.append({name: kwargs.get(name) for name in FLASH_KWARGS})
    batch, heads, length, dim = query.shape
    cu = kwargs["cu_seq_lens_q"].long()
    segment = torch.searchsorted(cu[1:], torch.arange(batch * length), right=True)
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(batch * length, batch * length, dtype=torch.bool).tril()
    flat = [t.transpose(0, 1).reshape(t.shape[1], -1, t.shape[-1])[None] for t in (query, key, value)]
    out = torch.nn.functional.scaled_dot_product_attention(*flat, attn_mask=allowed, scale=scaling, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(batch, length, heads, dim), None


_FLASH_SEEN: list = []


def test_flash_attention_is_handed_the_boundaries():
    from transformers import AttentionInterface

    AttentionInterface.register("flash_standin", _flash_standin)
    model, samples = _qwen25()
    syncfree.unpatch(model)
    alone = _alone(model, samples)
    syncfree.patch(model)
    batch = syncfree.packing_collator(model, max_tokens=40)(samples)
    model.config.text_config._attn_implementation = "flash_standin"
    try:
        _FLASH_SEEN.clear()
        with torch.no_grad():
            packed = model(**batch).logits
    finally:
        model.config.text_config._attn_implementation = "sdpa"
    packing = batch["syncfree_plan"].packing
    assert len(_FLASH_SEEN) == model.config.text_config.num_hidden_layers
    assert all(seen["cu_seq_lens_q"] is packing.cu_seq_lens and seen["max_length_q"] == packing.max_length
               for seen in _FLASH_SEEN)
    assert _worst(packed, batch, alone) <= TOLERANCE


_TEXT_COLLATOR = None


def _text_collator(max_tokens: int):
    global _TEXT_COLLATOR
    if _TEXT_COLLATOR is None:
        _TEXT_COLLATOR = load_config("qwen2-vl-tiny")
    return syncfree.packing_collator(_TEXT_COLLATOR, max_tokens=max_tokens)


@given(st.lists(st.integers(1, 30), min_size=1, max_size=12), st.integers(30, 70), st.booleans(), st.booleans())
@settings(max_examples=60, deadline=None)
def test_the_packed_layout_puts_each_sample_where_its_plan_says(lengths, max_tokens, first_fit, with_labels):
    generator = torch.Generator().manual_seed(len(lengths))
    samples = []
    for n in lengths:
        ids = torch.randint(1, 900, (1, n), generator=generator)
        sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": torch.zeros_like(ids)}
        if with_labels:
            sample["labels"] = torch.randint(0, 900, (1, n), generator=generator)
        samples.append(sample)
    collate = _text_collator(max_tokens)
    if first_fit:
        collate.order = "first_fit"
    batch = collate(samples)
    packing = batch["syncfree_plan"].packing
    ids, labels, positions = batch["input_ids"], batch["labels"], batch["position_ids"]
    assert positions.shape == (4, *ids.shape) and "attention_mask" not in batch
    for (r, start, n), i in zip(packing.spans(), packing.order):
        assert torch.equal(ids[r, start:start + n], samples[i]["input_ids"][0])
        own = samples[i]["labels"][0] if with_labels else samples[i]["input_ids"][0]
        assert labels[r, start] == -100 and torch.equal(labels[r, start + 1:start + n], own[1:])
        assert torch.equal(positions[:, r, start:start + n], torch.arange(n).expand(4, n))  # (text only: 0..n-1)
    for r, pad in enumerate(packing.padding):
        if pad:  # the row's padding: its own segment, positions restarted, nothing to learn
            assert (labels[r, -pad:] == -100).all() and torch.equal(positions[0, r, -pad:], torch.arange(pad))
    # Transformers' own reading of the text row finds the same segments as the plan's
    from transformers.masking_utils import find_packed_sequence_indices

    found = find_packed_sequence_indices(positions[0])
    assert found is None and packing.sequence_ids.max() == 0 or torch.equal(found, packing.sequence_ids)


def test_a_packed_batch_made_elsewhere_is_kept_apart_or_refused():
    """A padding-free batch without the collator's plan (the text row of its 4-row positions restarts per sample): the
    patched forward finds the boundaries there, with a cache too (where stock attends across them); a family that cannot
    keep them apart refuses it."""
    model, samples = _qwen25()
    batch = syncfree.packing_collator(model, max_tokens=64)(samples)
    elsewhere = {k: v for k, v in batch.items() if k != "syncfree_plan"}
    with torch.no_grad():
        packed = model(**{**elsewhere, "use_cache": True}).logits
    syncfree.unpatch(model)
    assert _worst(packed, batch, _alone(model, samples)) <= TOLERANCE
    if "qwen4_exp" not in SHIPPED:
        return  # (a hybrid family this release does not have)
    hybrid = syncfree.patch(build_model("qwen4-exp-tiny"))
    text = syncfree.packing_collator(load_config("qwen2-vl-tiny"), max_tokens=64)(
        [{"input_ids": torch.randint(1, 900, (1, n))} for n in (5, 9, 3)])
    text.pop("syncfree_plan")
    with pytest.raises(ValueError, match="refuses packed batches for qwen4_exp: its gated-DeltaNet"):
        syncfree.prepare(text, "cpu", hybrid)


@given(st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=5), min_size=1, max_size=4))
@settings(max_examples=100, deadline=None)
def test_the_segments_read_from_restarted_positions_are_the_packed_ones(rows):
    from syncfree.plan.packing import packing_from_positions

    width = max(sum(r) for r in rows) + 1
    packing = packing_of(rows, list(range(sum(map(len, rows)))), width)
    text = torch.cat([torch.cat([torch.arange(n) for n in lengths])[None] for lengths in packing.rows])
    found = packing_from_positions(torch.stack([text, text, text, text]), (len(rows), width))
    assert found is not None and found.rows == packing.rows
    assert torch.equal(found.sequence_ids, packing.sequence_ids) and torch.equal(found.cu_seq_lens, packing.cu_seq_lens)
    plain = torch.arange(width).expand(len(rows), width)
    assert packing_from_positions(torch.stack([plain] * 4), (len(rows), width)) is None


def test_sliding_window_layers_keep_samples_apart():
    """A text model with a sliding-window layer (Qwen2.5-VL's config allows one): its window mask is made by the same
    packed path, so a window never reaches into the sample before."""
    from transformers import AutoModelForImageTextToText

    config = load_config("qwen2.5-vl-tiny")
    config.text_config.layer_types = ["sliding_attention", "full_attention"]
    config.text_config.use_sliding_window, config.text_config.sliding_window = True, 6
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa").eval()
    assert model.model.language_model.has_sliding_layers
    samples = [processor_batch(model.config, [s]) for s in _samples(model.config)]
    alone = _alone(model, samples)
    syncfree.patch(model)
    batch = syncfree.packing_collator(model, max_tokens=48)(samples)
    with torch.no_grad():
        for use_cache in (False, True):
            assert _worst(model(**{**batch, "use_cache": use_cache}).logits, batch, alone) <= TOLERANCE


def test_dataloader_workers_pack_and_carry_the_plan():
    from torch.utils.data import DataLoader

    model, samples = _qwen25()
    loader = DataLoader(samples, batch_size=3, num_workers=1, collate_fn=syncfree.packing_collator(model, max_tokens=40))
    batches = list(loader)
    assert len(batches) == 1 and batches[0]["syncfree_plan"].packing is not None
    with torch.no_grad():
        packed = model(**batches[0]).logits
    syncfree.unpatch(model)
    assert _worst(packed, batches[0], _alone(model, samples)) <= TOLERANCE


def test_first_fit_reorders_samples_with_their_images():
    model, samples = _qwen25()
    samples = samples + [processor_batch(model.config, [s]) for s in _samples(model.config)[3:]]
    batch = syncfree.packing_collator(model, max_tokens=30, order="first_fit")(samples)
    order = batch["syncfree_plan"].packing.order
    assert list(order) != sorted(order)  # (a later, shorter sample filled an earlier row)
    with torch.no_grad():
        packed = model(**batch).logits
    syncfree.unpatch(model)
    assert _worst(packed, batch, _alone(model, samples)) <= TOLERANCE


def test_a_hybrids_recurrent_layers_run_each_packed_sample_alone_without_a_sync():
    """Qwen3.5's gated-DeltaNet layers: each sample from a fresh state (the parity test above shows its logits); the
    prepared packed forward and backward make no sync, as the attention-only families'."""
    model = syncfree.patch(build_model("qwen3.5-tiny"))
    samples = [processor_batch(model.config, [s]) for s in _samples(model.config)[:4]]
    batch = syncfree.packing_collator(model, max_tokens=64)(samples)
    with syncfree.emulate_cuda():
        model.to("cuda").train()
        try:
            with syncfree.audit() as step:
                model(**syncfree.prepare(batch, "cuda", model)).loss.backward()
        finally:
            model.to("cpu").eval()
    assert step.syncs == [] and not step.blocking_copies, step.table()


def test_packed_3d_positions_without_their_text_row_are_refused():
    """Stock's own per-sample 3D positions, packed without the text row: nothing can read the boundaries from them, and
    stock attends across the samples; refused instead, naming what to give."""
    model, samples = _qwen25()
    batch = syncfree.packing_collator(model, max_tokens=64)(samples)
    three = {k: v for k, v in batch.items() if k != "syncfree_plan"}
    three["position_ids"] = batch["position_ids"][1:]
    with pytest.raises(ValueError, match="no text row"):
        syncfree.prepare(three, "cpu", model)
    with pytest.raises(ValueError, match="no text row"), torch.no_grad():
        model(**three)
    # (one sample per row, as stock's get_rope_index makes them: never taken for packed)
    alone = {k: v for k, v in samples[0].items() if k != "attention_mask"}
    positions, _ = model.model.get_rope_index(alone["input_ids"], alone["mm_token_type_ids"], alone["image_grid_thw"])
    syncfree.prepare({**alone, "position_ids": positions}, "cpu", model)


@pytest.mark.skipif("qwen4_exp" not in SHIPPED, reason="this Transformers release has no Qwen4-Exp")
def test_positions_restarting_at_padding_under_a_mask_of_their_own_are_not_a_packed_batch():
    """generate() with a static cache hands the forward per-layer masks (a dict) and positions that restart where a
    row's padding ends; stock reads no packed samples from positions when a mask is given. The patched forward neither:
    it gives stock's tokens, where it refused the batch as packed in a family that refuses packing (Qwen4-Exp)."""
    torch.manual_seed(0)
    model = build_model("qwen4-exp-tiny").eval()
    side = _unit(model.config)
    batch = processor_batch(model.config, [[Text(3), Image(side, side), Text(2)], [Text(1), Image(side, side), Text(9)]],
                            padding_side="left")
    embeds = model.get_input_embeddings()(batch.pop("input_ids"))
    options = dict(max_new_tokens=3, do_sample=False, cache_implementation="static", eos_token_id=-1, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(inputs_embeds=embeds, **batch, **options)
        syncfree.patch(model)
        try:
            got = model.generate(inputs_embeds=embeds, **batch, **options)
        finally:
            syncfree.unpatch(model)
    assert torch.equal(got, want)


def test_prepare_reads_no_packing_from_positions_beside_a_4d_mask():
    """A batch whose 4-row positions restart inside a row but that carries a 4D mask of its own: stock's mask code
    reads no packed samples then, and neither does the plan."""
    config = load_config("qwen2-vl-tiny")
    text = syncfree.packing_collator(config, max_tokens=32)([{"input_ids": torch.randint(1, 900, (1, n))}
                                                             for n in (5, 9, 3)])
    text.pop("syncfree_plan")
    assert syncfree.prepare(dict(text), None, config)["syncfree_plan"].packing is not None  # (no mask: packed)
    width = text["input_ids"].shape[1]
    text["attention_mask"] = torch.ones(text["input_ids"].shape[0], 1, width, width)
    assert syncfree.prepare(text, None, config)["syncfree_plan"].packing is None


@pytest.mark.parametrize("model_type", [t for t, f in sorted(FAMILIES.items())
                                        if f.layout.audio.encoder and f.layout.rope.audio_class and t in SHIPPED])
def test_a_thinker_takes_a_batch_packed_elsewhere_with_stocks_logits(model_type):
    """A padding-free batch packed elsewhere, as Transformers' own test makes one for the Omni thinkers: the padded
    batch's kept tokens in one row, its audio and pixels as they were, 4-row positions (each sample's text row from 0,
    stock's 3D index of the padded batch). Without a cache stock keeps the samples apart by the restarts, and the
    patched forward gives stock's logits; with one too (stock attends across them there). It refused the batch, as it
    refuses the collator's, which lays out no audio."""
    from syncfree.inputs import Audio

    torch.manual_seed(0)
    model = build_model(tiny_preset(model_type)).eval()
    side = _unit(model.config)
    padded = processor_batch(model.config, [[Text(3), Image(side, side), Text(1), Audio(90), Text(2)],
                                            [Text(5), Audio(120), Text(1)]], padding_side="right")
    kept = padded["attention_mask"].bool()
    rope = model.get_rope_index if hasattr(model, "get_rope_index") else model.model.get_rope_index
    positions, _ = rope(input_ids=padded["input_ids"], image_grid_thw=padded["image_grid_thw"],
                        attention_mask=padded["attention_mask"],
                        audio_seqlens=padded["feature_attention_mask"].sum(1))
    text = torch.cat([torch.arange(int(n)) for n in kept.sum(1)])[None]
    packed = {name: padded[name] for name in ("input_features", "feature_attention_mask", "pixel_values",
                                              "image_grid_thw")}
    packed.update(input_ids=padded["input_ids"][kept][None],
                  position_ids=torch.cat([text, positions[:, kept]])[:, None, :])
    with torch.no_grad():
        want = model(**packed, use_cache=False).logits
        syncfree.patch(model)
        try:
            got = model(**packed, use_cache=False).logits
            cached = model(**packed, use_cache=True).logits
            assert syncfree.prepare(dict(packed), None, model)["syncfree_plan"].packing is not None
        finally:
            syncfree.unpatch(model)
    assert torch.equal(got, want)
    torch.testing.assert_close(cached, want)  # (SDPA with a cache of no tokens: its own kernel choice)
