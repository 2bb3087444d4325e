"""compile_vision(): one static graph per patch-count bucket, whatever the layout of images and frames.

The padded outputs match the unpadded tower to rounding, not bit for bit: the padding segment is
separate in attention and every other op is per row, but the CPU's matrix multiply may pick another
kernel for another row count (in the merger at a handful of rows, 2.6e-8 seen), so the comparison
has a tolerance.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

import syncfree
from syncfree.compile_vision import BucketError
from syncfree.presets import build_model

ATOL = 1e-6
BUCKETS = (64, 256, 1024)


def _layouts(count: int, seed: int = 0):
    rnd = random.Random(seed)
    for _ in range(count):
        items = rnd.randint(1, 5)
        yield torch.tensor([[rnd.choice([1, 1, 2]), 2 * rnd.randint(1, 6), 2 * rnd.randint(1, 6)] for _ in range(items)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_a_hundred_layouts_compile_no_more_graphs_than_buckets_and_match_the_tower(name):
    tower = build_model(name).model.visual
    stock = copy.deepcopy(tower)
    graphs = []

    def counting_backend(gm, example_inputs):  # how many graphs Dynamo hands over (fullgraph: one per shape)
        graphs.append(gm)
        return gm.forward

    torch.compiler.reset()
    compiled = syncfree.compile_vision(syncfree.patch(copy.deepcopy(tower)), buckets=BUCKETS,
                                       backend=counting_backend)
    patch = tower.config.patch_size
    used = set()
    with torch.no_grad():
        for grid in _layouts(100):
            pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * patch * patch)
            want = stock(pixels, grid_thw=grid)
            got = compiled(pixels, grid_thw=grid)
            used.add(next(b for b in BUCKETS if b >= pixels.shape[0]))
            torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=ATOL, rtol=0)
            torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=ATOL, rtol=0)
    assert len(used) >= 2 and len(graphs) <= len(used)


def test_the_bucketed_path_has_no_sync():
    tower = syncfree.compile_vision(syncfree.patch(build_model("qwen3-vl-tiny").model.visual), buckets=BUCKETS,
                                    compile=False)  # the same padded path, eagerly: the auditor sees every op
    grid = torch.tensor([[2, 4, 6], [1, 8, 8]])  # on the host, as prepare() leaves it
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 16 * 16)
    with syncfree.emulate_cuda(), torch.no_grad():
        tower.to("cuda")
        moved = pixels.to("cuda")
        with syncfree.assert_no_sync():
            tower(moved, grid_thw=grid)


def test_inputs_beyond_the_largest_bucket_and_bad_buckets_are_refused():
    model = syncfree.patch(build_model("qwen3-vl-tiny"))
    with pytest.raises(BucketError, match="increasing positive multiples of spatial_merge_size\\*\\*2 = 4"):
        syncfree.compile_vision(model, buckets=(64, 30))
    tower = syncfree.compile_vision(model, buckets=(64,), compile=False).model.visual
    grid = torch.tensor([[1, 8, 10]])  # 80 patches
    with pytest.raises(BucketError, match="80 patches do not fit the largest bucket, 64: give compile_vision\\(\\) "
                                          "larger buckets"), torch.no_grad():
        tower(torch.randn(80, 3 * 2 * 16 * 16), grid_thw=grid)


def test_the_model_forward_uses_the_buckets_and_unpatch_removes_them():
    from syncfree.inputs import Image, Text, build_inputs

    stock = build_model("qwen3-vl-tiny")
    model = syncfree.compile_vision(syncfree.patch(build_model("qwen3-vl-tiny")), buckets=BUCKETS, compile=False)
    batch = build_inputs(stock.config, [[Text(3), Image(64, 96), Text(2), Image(32, 32), Text(1)]])
    with torch.no_grad():
        torch.testing.assert_close(model(**syncfree.prepare(batch, "cpu", model)).logits, stock(**batch).logits,
                                   atol=1e-5, rtol=0)
    syncfree.unpatch(model)
    assert not hasattr(model.model.visual, "_syncfree_buckets")
