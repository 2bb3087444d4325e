"""``syncfree.plan.rope.rope_index`` against stock ``get_rope_index`` of Qwen2-VL and Qwen2.5-VL (whole-video
runs, video time scaling, both the newer and the Transformers 5.17 rounding): same numbers, dtypes,
shapes and devices, loud failures on too few grids or durations, no host sync, no graph break."""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from syncfree.audit import assert_no_sync, emulate_cuda
from syncfree.plan.rope import rope_index
from syncfree.plan.rope_host import rope_index_host

IMAGE, VIDEO, START, END = 1000, 1001, 1002, 1003
MERGE = 2
TOKENS_PER_SECOND = 2
_TEXT = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[2, 3, 3]))
_TOKENS = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)
_VISION = {
    "qwen2_vl": dict(depth=1, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=64, patch_size=14,
                     temporal_patch_size=2, spatial_merge_size=MERGE),
    "qwen2_5_vl": dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                       temporal_patch_size=2, spatial_merge_size=MERGE, window_size=112, fullatt_block_indexes=[0],
                       tokens_per_second=TOKENS_PER_SECOND),
}


def _stock_model(model_type: str):
    config = transformers.AutoConfig.for_model(model_type, vision_config=_VISION[model_type], text_config=_TEXT,
                                               **_TOKENS)
    return transformers.AutoModel.from_config(config).eval()  # Qwen2VLModel / Qwen2_5_VLModel


@pytest.fixture(scope="module")
def qwen2():
    return _stock_model("qwen2_vl")


@pytest.fixture(scope="module")
def qwen25():
    return _stock_model("qwen2_5_vl")


def _truncates_seconds(model) -> bool:
    """Whether this Transformers takes int(seconds) before scaling: a 0.5 s grid then gets time step 0."""
    ids = torch.tensor([[START] + [VIDEO] * 2 + [END]])
    types = torch.tensor([[0, 2, 2, 0]])
    pos, _ = model.get_rope_index(ids, types, None, torch.tensor([[2, 2, 2]]), second_per_grid_ts=torch.tensor([0.5]))
    return pos[0, 0, 2].item() == 1  # frame 1 at start (1) + 0, not + 1


@pytest.fixture(scope="module")
def truncate(qwen25) -> bool:
    return _truncates_seconds(qwen25)


def test_rounding_follows_the_transformers_version(truncate):
    version = tuple(int(p) for p in transformers.__version__.split(".")[:2])
    if version <= (5, 17):
        assert truncate
    elif version >= (5, 24):
        assert not truncate


# ---- processor-style inputs ------------------------------------------------------------------------------
def build(rows: list[list[tuple]], padding_side: str = "left", seed: int = 0) -> dict:
    """Token rows as the Qwen2/2.5-VL processors lay them out.

    Items: ("text", n), ("image", t, h, w), ("video", t, h, w) with grids in patches (h, w even).
    A vision item is start + t*h*w/merge**2 pad tokens + end, a whole video being ONE run (no
    per-frame timestamps). Rows are padded (id 0, type 0, mask 0) on ``padding_side``.
    """
    rng = random.Random(seed)
    seqs, images, videos = [], [], []
    for row in rows:
        ids, types = [], []
        for kind, *dims in row:
            if kind == "text":
                ids += [rng.randrange(5, 1000) for _ in range(dims[0])]
                types += [0] * dims[0]
                continue
            t, h, w = dims
            n = t * h * w // MERGE**2
            code = 1 if kind == "image" else 2
            ids += [START] + [IMAGE if code == 1 else VIDEO] * n + [END]
            types += [0] + [code] * n + [0]
            (images if code == 1 else videos).append([t, h, w])
        seqs.append((ids, types))
    width = max(len(ids) for ids, _ in seqs)
    out = {k: torch.zeros(len(rows), width, dtype=torch.long) for k in ("input_ids", "mm_token_type_ids",
                                                                          "attention_mask")}
    for r, (ids, types) in enumerate(seqs):
        cols = slice(width - len(ids), width) if padding_side == "left" else slice(0, len(ids))
        out["input_ids"][r, cols] = torch.tensor(ids)
        out["mm_token_type_ids"][r, cols] = torch.tensor(types)
        out["attention_mask"][r, cols] = 1
    out["image_grid_thw"] = torch.tensor(images) if images else None
    out["video_grid_thw"] = torch.tensor(videos) if videos else None
    return out


def _text_holes(mask: torch.Tensor, types: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
    """Zero picked kept text tokens whose neighbours are kept text too: the runs stay what they were."""
    text = (types == 0) & (mask == 1)
    inner = text.clone()
    inner[:, 1:] &= text[:, :-1]
    inner[:, :-1] &= text[:, 1:]
    inner[:, 0] = inner[:, -1] = False  # a row's first and last kept tokens stay
    return torch.where(inner & pick, 0, mask)


# ---- comparison --------------------------------------------------------------------------------------------
def _stock(model, batch, mask, seconds=None):
    extra = {} if "Qwen2VL" in type(model).__name__ else {"second_per_grid_ts": seconds}
    return model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"], batch["image_grid_thw"],
                                batch["video_grid_thw"], attention_mask=mask, **extra)


def _ours(batch, mask, *, qwen25: bool, seconds=None, truncate=False):
    timing = dict(tokens_per_second=TOKENS_PER_SECOND, second_per_grid_ts=seconds, truncate_seconds=truncate) \
        if qwen25 else {}
    args = (batch["input_ids"], batch["mm_token_type_ids"], batch["image_grid_thw"], batch["video_grid_thw"], mask)
    got = rope_index(*args, spatial_merge_size=MERGE, split_video_frames=False, **timing)
    if all(not isinstance(a, torch.Tensor) or a.device.type == "cpu" for a in args):  # the plan's NumPy twin
        _same(rope_index_host(*args, spatial_merge_size=MERGE, split_video_frames=False, **timing), got)
    return got


def _same(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device, (g, w)
        assert torch.equal(g, w), f"\n got {g}\nwant {w}"


def _check(model, batch, mask, seconds=None, truncate=False):
    qwen25 = "Qwen2_5" in type(model).__name__
    _same(_ours(batch, mask, qwen25=qwen25, seconds=seconds, truncate=truncate), _stock(model, batch, mask, seconds))


side = st.sampled_from([2, 4, 6, 8])
items = st.one_of(
    st.tuples(st.just("text"), st.integers(1, 6)),
    st.tuples(st.just("image"), st.just(1), side, side),
    st.tuples(st.just("video"), st.integers(1, 4), st.sampled_from([2, 4, 6]), st.sampled_from([2, 4, 6])),
)
rows = st.lists(items, min_size=1, max_size=5)
batches = st.fixed_dictionaries(dict(rows=st.lists(rows, min_size=1, max_size=3), left=st.booleans(),
                                     seed=st.integers(0, 2**16), holes=st.booleans(), drop_mask=st.booleans()))
SECONDS = [0.5, 1.0, 1.5, 2.0, 3.0, 0.7, 2 / 3]  # the last two are inexact in binary


def _draw_batch(params) -> tuple[dict, torch.Tensor | None]:
    batch = build(params["rows"], "left" if params["left"] else "right", params["seed"])
    mask = batch["attention_mask"]
    if params["holes"]:
        pick = torch.rand(mask.shape, generator=torch.Generator().manual_seed(params["seed"])) < 0.3
        mask = _text_holes(mask, batch["mm_token_type_ids"], pick)
    # No mask is only what stock sees for unpadded rows.
    if params["drop_mask"] and bool(mask.all()):
        mask = None
    return batch, mask


PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])


@PROPERTY
@given(params=batches)
def test_qwen2_vl_matches_stock(qwen2, params):
    batch, mask = _draw_batch(params)
    _check(qwen2, batch, mask)


@PROPERTY
@given(params=batches, form=st.sampled_from(["none", "float32", "float64", "list"]), data=st.data())
def test_qwen2_5_vl_matches_stock(qwen25, truncate, params, form, data):
    batch, mask = _draw_batch(params)
    n_videos = 0 if batch["video_grid_thw"] is None else batch["video_grid_thw"].shape[0]
    values = data.draw(st.lists(st.sampled_from(SECONDS), min_size=n_videos, max_size=n_videos))
    seconds = {"none": None, "float32": torch.tensor(values, dtype=torch.float32),
               "float64": torch.tensor(values, dtype=torch.float64), "list": values}[form]
    _check(qwen25, batch, mask, seconds, truncate)


def test_fixed_layouts(qwen2, qwen25, truncate):
    samples = [
        [("image", 1, 4, 6), ("text", 3), ("video", 4, 6, 2), ("image", 1, 2, 8)],  # starts and ends with vision
        [("text", 7)],  # text only
        [("video", 1, 2, 2)],  # a one-frame video, nothing else
        [("text", 2), ("video", 3, 2, 2), ("video", 2, 4, 2), ("text", 1)],  # adjacent videos: one run here
    ]
    seconds = torch.tensor([0.5, 1.5, 3.0, 2.0])
    for padding_side in ("left", "right"):
        batch = build(samples, padding_side)
        _check(qwen2, batch, batch["attention_mask"])
        for secs in (None, seconds, seconds.tolist()):
            _check(qwen25, batch, batch["attention_mask"], secs, truncate)
    single = build(samples[:1])
    _check(qwen2, single, None)
    _check(qwen25, single, None, seconds[:1], truncate)


def test_images_are_never_time_scaled(qwen25, truncate):
    # Not a processor layout (images have t=1 there), but stock treats an image's t without scaling.
    batch = build([[("text", 2), ("image", 2, 2, 4), ("video", 3, 2, 2), ("text", 2)]])
    _check(qwen25, batch, batch["attention_mask"], torch.tensor([3.0]), truncate)
    pos, _ = _ours(batch, None, qwen25=True, seconds=torch.tensor([3.0]), truncate=truncate)
    image_t = pos[0, 0, 3:7]
    assert image_t.tolist() == [3, 3, 4, 4]


def test_adjacent_images_and_videos(qwen2, qwen25, truncate):
    # Runs change on any change of type; image and video runs may touch, also across a hole in the mask.
    types = torch.tensor([[0, 2, 2, 1, 1, 0, 1, 1, 2, 2, 0], [1, 1, 1, 1, 2, 2, 0, 0, 2, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0]])
    types = types * mask
    # Image runs (one joined across the hole in row 0): 4 tokens each; video runs: 2 tokens each.
    batch = {"input_ids": torch.where(types == 1, IMAGE, torch.where(types == 2, VIDEO, 5)),
             "mm_token_type_ids": types, "image_grid_thw": torch.tensor([[1, 4, 4], [1, 4, 4]]),
             "video_grid_thw": torch.tensor([[2, 2, 2], [1, 2, 4], [2, 2, 2], [1, 4, 2]])}
    _check(qwen2, batch, mask)
    _check(qwen25, batch, mask, torch.tensor([1.5, 0.5, 2.0, 3.0]), truncate)


def test_int32_ids_and_types(qwen2, qwen25, truncate):
    batch = build([[("text", 3), ("image", 1, 4, 2), ("video", 2, 2, 4), ("text", 2)], [("text", 4)]])
    batch["mm_token_type_ids"] = batch["mm_token_type_ids"].int()
    _check(qwen2, batch, batch["attention_mask"])
    _check(qwen25, batch, batch["attention_mask"], torch.tensor([1.5]), truncate)
    # position_ids take input_ids' dtype (stock shows it only without a mask).
    single = build([[("text", 3), ("video", 2, 2, 4), ("text", 2)]])
    single["input_ids"] = single["input_ids"].int()
    _check(qwen25, single, None, torch.tensor([1.5]), truncate)


def test_too_few_grids_or_seconds_fail_loudly():
    batch = build([[("text", 2), ("image", 1, 2, 2), ("video", 2, 2, 2)], [("video", 1, 2, 2), ("text", 2)]])
    mask, videos = batch["attention_mask"], batch["video_grid_thw"]

    def run(**kw):
        args = {**batch, **kw}
        return rope_index(args["input_ids"], args["mm_token_type_ids"], args["image_grid_thw"],
                          args["video_grid_thw"], mask, spatial_merge_size=MERGE, split_video_frames=False,
                          tokens_per_second=TOKENS_PER_SECOND, second_per_grid_ts=args.get("seconds"))

    with pytest.raises(RuntimeError, match="video runs than video_grid_thw"):
        run(video_grid_thw=videos[:1])
    with pytest.raises(RuntimeError, match="video runs than video_grid_thw"):
        run(video_grid_thw=None)
    with pytest.raises(RuntimeError, match="second_per_grid_ts"):
        run(seconds=torch.tensor([1.0]))
    with pytest.raises(RuntimeError, match="second_per_grid_ts"):
        run(seconds=[])
    with pytest.raises(RuntimeError, match="image"):
        run(image_grid_thw=None)
    run(seconds=torch.tensor([1.0, 2.0, 3.0]))  # spare grids and seconds are ignored, as in stock


def test_bad_parameter_combinations():
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="tokens_per_second"):
        rope_index(ids, ids, spatial_merge_size=MERGE, split_video_frames=False, second_per_grid_ts=[1.0])
    with pytest.raises(ValueError, match="tokens_per_second"):
        rope_index(ids, ids, spatial_merge_size=MERGE, split_video_frames=False, truncate_seconds=True)
    with pytest.raises(ValueError, match="split_video_frames=False"):
        rope_index(ids, ids, spatial_merge_size=MERGE, tokens_per_second=TOKENS_PER_SECOND)


def _mixed():
    return build([[("text", 5), ("image", 1, 4, 4), ("text", 3), ("video", 3, 4, 2), ("text", 4)],
                  [("text", 4), ("video", 2, 2, 4), ("image", 1, 2, 4), ("text", 6)], [("text", 9)]])


def test_no_host_sync_on_device(qwen2, qwen25, truncate):
    batch = _mixed()
    seconds = torch.tensor([1.5, 0.5])
    mask = batch["attention_mask"]
    want25, want2 = _stock(qwen25, batch, mask, seconds), _stock(qwen2, batch, mask)
    with emulate_cuda():
        dev = {k: v.to("cuda") for k, v in batch.items()}
        args = (dev["input_ids"], dev["mm_token_type_ids"], dev["image_grid_thw"], dev["video_grid_thw"],
                dev["attention_mask"])
        timing = dict(tokens_per_second=TOKENS_PER_SECOND, truncate_seconds=truncate)
        dev_seconds = seconds.to("cuda")
        with assert_no_sync():
            got25 = rope_index(*args, spatial_merge_size=MERGE, split_video_frames=False,
                               second_per_grid_ts=dev_seconds, **timing)
            got2 = rope_index(*args, spatial_merge_size=MERGE, split_video_frames=False)
        # Durations given on the host (tensor or list) are copied over: no sync, but the auditor
        # counts a copy from pageable host memory as blocking, as CUDA stages it.
        with assert_no_sync(max_blocking_copies=2):
            host25 = [rope_index(*args, spatial_merge_size=MERGE, split_video_frames=False, second_per_grid_ts=secs,
                                 **timing) for secs in (seconds, seconds.tolist())]
        assert all(t.device.type == "cuda" for t in (*got25, *got2, *host25[0], *host25[1]))
        got = [tuple(t.cpu() for t in pair) for pair in (got25, got2, *host25)]
    for pair, want in zip(got, (want25, want2, want25, want25), strict=True):
        _same(pair, want)


def test_no_graph_breaks(truncate):
    torch._dynamo.reset()

    def fn(ids, types, images, videos, mask, seconds):
        return rope_index(ids, types, images, videos, mask, spatial_merge_size=MERGE, split_video_frames=False,
                          tokens_per_second=TOKENS_PER_SECOND, second_per_grid_ts=seconds, truncate_seconds=truncate)

    batch = _mixed()
    explained = torch._dynamo.explain(fn)(batch["input_ids"], batch["mm_token_type_ids"], batch["image_grid_thw"],
                                          batch["video_grid_thw"], batch["attention_mask"], torch.tensor([1.5, 0.5]))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    torch._dynamo.reset()
