"""``syncfree.plan.rope.rope_index`` against stock ``Qwen3VLModel.get_rope_index``: same numbers, dtypes,
shapes and devices for every layout, a loud failure on too few grids, and no host sync."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from syncfree.audit import assert_no_sync, emulate_cuda
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.plan.rope import rope_index
from syncfree.plan.rope_host import rope_index_host
from syncfree.presets import build_model

KEYS = ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw", "attention_mask")


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3-vl-tiny")


def _args(batch: dict, mask=True) -> tuple:
    args = tuple(batch.get(k) for k in KEYS)
    return args if mask else args[:-1] + (None,)


def _stock(model, args):
    ids, types, images, videos, mask = args
    return model.model.get_rope_index(input_ids=ids, mm_token_type_ids=types, image_grid_thw=images,
                                      video_grid_thw=videos, attention_mask=mask)


def _ours(model, args):
    got = rope_index(*args, spatial_merge_size=model.config.vision_config.spatial_merge_size)
    if all(not isinstance(a, torch.Tensor) or a.device.type == "cpu" for a in args):  # the plan's NumPy twin
        _same(rope_index_host(*args, spatial_merge_size=model.config.vision_config.spatial_merge_size), got)
    return got


def _same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device
        assert torch.equal(g, w), f"\n got {g}\nwant {w}"


def _check(model, args):
    _same(_ours(model, args), _stock(model, args))


def _text_holes(mask: torch.Tensor, types: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
    """Zero ``pick``-ed kept text tokens whose kept neighbours are text too.

    Vision runs are always bracketed by text start/end tokens that stay kept, so the
    runs (and so the grids they take) are the same as without the holes.
    """
    mask = mask.clone()
    text = (types == 0) & (mask == 1)
    inner = text.clone()
    inner[:, 1:] &= text[:, :-1]
    inner[:, :-1] &= text[:, 1:]
    inner[:, 0] = inner[:, -1] = False
    mask[inner & pick] = 0
    return mask


side = st.integers(1, 4).map(lambda n: 32 * n)
items = st.one_of(
    st.builds(Text, st.integers(1, 6)),
    st.builds(Image, side, side),
    st.builds(Video, st.sampled_from([2, 4, 6]), st.integers(1, 3).map(lambda n: 32 * n),
              st.integers(1, 3).map(lambda n: 32 * n), st.sampled_from([1.0, 2.0])),
)
rows = st.one_of(st.lists(items, min_size=1, max_size=5), st.lists(st.builds(Text, st.integers(1, 8)), min_size=1,
                                                                   max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=st.lists(rows, min_size=1, max_size=4), left=st.booleans(), seed=st.integers(0, 2**16),
       holes=st.booleans(), drop_mask=st.booleans())
def test_matches_stock(model, samples, left, seed, holes, drop_mask):
    batch = build_inputs(model.config, samples, padding_side="left" if left else "right", seed=seed)
    if holes:
        pick = torch.rand(batch["attention_mask"].shape, generator=torch.Generator().manual_seed(seed)) < 0.3
        batch["attention_mask"] = _text_holes(batch["attention_mask"], batch["mm_token_type_ids"], pick)
    # attention_mask=None is only meaningful (and only what stock sees) for unpadded rows.
    unpadded = bool(batch["attention_mask"].all())
    _check(model, _args(batch, mask=not (drop_mask and unpadded)))


def test_fixed_layouts(model):
    samples = [
        [Image(64, 96), Text(3), Video(6, 64, 32), Image(32, 128)],  # starts and ends with vision
        [Text(7)],  # text only
        [Video(2, 32, 32)],  # one video frame, nothing else
        [Text(2), Image(128, 32), Image(32, 32), Text(1)],  # adjacent images
    ]
    for padding_side in ("left", "right"):
        _check(model, _args(build_inputs(model.config, samples, padding_side=padding_side)))
    single = build_inputs(model.config, samples[:1])
    _check(model, _args(single, mask=False))
    _same(_ours(model, _args(single, mask=False)), _ours(model, _args(single)))


def test_zeros_inside_the_mask(model):
    batch = build_inputs(model.config, [[Text(6), Image(64, 64), Text(6), Video(4, 64, 32), Text(6)],
                                        [Text(3), Image(32, 64), Text(9)]], padding_side="left")
    mask, types = batch["attention_mask"], batch["mm_token_type_ids"]
    every_other = (torch.arange(mask.shape[1]) % 2 == 0).expand_as(mask)
    for pick in (every_other, ~every_other, torch.ones_like(every_other)):
        holes = _text_holes(mask, types, pick)
        # Holes strictly inside rows: the last token of each row and the first kept one stay.
        assert bool((holes != mask).any()) and bool(holes[:, -1].eq(1).all())
        assert torch.equal(holes.argmax(1), mask.argmax(1))
        batch["attention_mask"] = holes
        _check(model, _args(batch))


def test_vision_runs_of_different_kinds_back_to_back(model):
    # Not a processor layout, but stock splits runs on any change of type: image and video
    # runs may touch, also across a hole in the mask (which can split no run).
    types = torch.tensor([[0, 2, 2, 1, 1, 0, 1, 1, 2, 2, 0],
                          [1, 1, 1, 1, 2, 2, 0, 0, 2, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0]])
    types = types * mask
    ids = torch.where(types == 1, model.config.image_token_id, torch.where(types == 2, model.config.video_token_id, 5))
    images = torch.tensor([[1, 4, 4], [1, 4, 4]])
    videos = torch.tensor([[2, 2, 4], [2, 4, 2]])
    _check(model, (ids, types, images, videos, mask))


def test_int32_types_and_ids(model):
    batch = build_inputs(model.config, [[Text(4), Image(64, 32), Video(4, 32, 64), Text(2)], [Text(5)]])
    batch["mm_token_type_ids"] = batch["mm_token_type_ids"].int()
    _check(model, _args(batch))
    # position_ids take input_ids' dtype. Stock can only show it without a mask: with one,
    # its index_put of int64 positions into an int32 tensor raises.
    single = build_inputs(model.config, [[Text(4), Image(64, 32), Video(4, 32, 64), Text(2)]])
    single["input_ids"] = single["input_ids"].int()
    _check(model, _args(single, mask=False))
    pos, deltas = _ours(model, _args(single))
    assert pos.dtype == torch.int32 and deltas.dtype == torch.int64
    _same((pos, deltas), _ours(model, _args(single, mask=False)))


def test_too_few_grids_fail_loudly(model):
    batch = build_inputs(model.config, [[Text(2), Image(64, 64), Video(4, 32, 32)], [Image(32, 32), Text(2)]])
    ids, types, images, videos, mask = _args(batch)
    with pytest.raises(RuntimeError, match="image"):
        _ours(model, (ids, types, images[:1], videos, mask))
    with pytest.raises(RuntimeError, match="image"):
        _ours(model, (ids, types, None, videos, mask))
    short = videos.clone()
    short[:, 0] = 1  # two frames in the tokens, one in the grid
    with pytest.raises(RuntimeError, match="video"):
        _ours(model, (ids, types, images, short, mask))
    with pytest.raises(RuntimeError, match="video"):
        _ours(model, (ids, types, images, None, mask))
    # Spare grids are ignored, as in stock.
    _check(model, (ids, types, torch.cat([images, images]), torch.cat([videos, videos]), mask))


def _mixed(model):
    return build_inputs(model.config, [[Text(5), Image(64, 64), Text(3), Video(4, 64, 32), Text(4)],
                                       [Text(4), Image(32, 64), Text(6)], [Text(9)]], padding_side="left")


def test_no_host_sync_on_device(model):
    batch = _mixed(model)
    want_pos, want_deltas = _stock(model, _args(batch))
    merge = model.config.vision_config.spatial_merge_size
    with emulate_cuda():
        dev = {k: v.to("cuda") for k, v in batch.items()}
        with assert_no_sync():
            pos, deltas = rope_index(dev["input_ids"], dev["mm_token_type_ids"], dev.get("image_grid_thw"),
                                     dev.get("video_grid_thw"), dev["attention_mask"], spatial_merge_size=merge)
        assert pos.device.type == "cuda" and deltas.device.type == "cuda"
        got_pos, got_deltas = pos.cpu(), deltas.cpu()
        # Grids left on the CPU are moved to the tokens' device: still no sync, but the
        # auditor counts a copy from pageable host memory as blocking, as CUDA stages it.
        with assert_no_sync(max_blocking_copies=2):
            pos2, _ = rope_index(dev["input_ids"], dev["mm_token_type_ids"], batch["image_grid_thw"],
                                 batch["video_grid_thw"], dev["attention_mask"], spatial_merge_size=merge)
        assert pos2.device.type == "cuda"
        got_pos2 = pos2.cpu()
    for got in (got_pos, got_pos2):
        assert got.dtype == want_pos.dtype and torch.equal(got, want_pos)
    assert got_deltas.dtype == want_deltas.dtype and torch.equal(got_deltas, want_deltas)


def test_no_graph_breaks(model):
    torch._dynamo.reset()
    merge = model.config.vision_config.spatial_merge_size

    def fn(*args):
        return rope_index(*args, spatial_merge_size=merge)

    args = _args(_mixed(model))
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    torch._dynamo.reset()
