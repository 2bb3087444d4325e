"""10,000 ``prepare()`` calls leave the registry of prepared batches and the process's memory where they were
(issue 22: plans once held their batch's tensors, so every entry lived forever: +212 MB in 3,000 calls)."""

from __future__ import annotations

import gc
import os

import pytest
import torch

import syncfree
from syncfree.audit import emulate_cuda
from syncfree.inputs import build_inputs, named_layout
from syncfree.plan import active
from syncfree.presets import load_config

CALLS = 10_000


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ten_thousand_prepares_keep_the_registry_and_memory_flat(device):
    config = load_config("qwen3-vl-tiny")
    batch = build_inputs(config, named_layout("mixed", side=64))
    gc.collect()
    before = len(active._registry)
    with emulate_cuda() if device == "cuda" else torch.no_grad():
        rss = []
        for i in range(CALLS):
            syncfree.prepare({k: v.clone() for k, v in batch.items()}, device, config)
            if i % 1000 == 999:
                gc.collect()
                rss.append(_rss_mb())
        gc.collect()
        assert len(active._registry) == before
    # The first thousand calls warm allocators and caches; after that nothing may accumulate (a kept plan
    # holds its batch's host copies and pixel values: tens of KB per call, hundreds of MB over 9,000 calls).
    assert rss[-1] - rss[0] < 30, rss
