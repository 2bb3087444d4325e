"""DDP and FSDP2 on gloo, two processes on the CPU, started with torch.multiprocessing as users start them:
the patched model gives the stock model's losses and gradients, and with vision_every_step a rank with a
text-only micro-batch stays in step with one that has images and video.

About 30 s each on 2 cores (two spawned processes, each importing Transformers and building the model).
"""

from __future__ import annotations

import io
import socket

import pytest
import torch
import torch.multiprocessing as mp

import distributed_worker

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                 reason="needs torch.distributed with gloo")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(jobs: list) -> dict:
    """Each job: (engine, variant, {rank: layout}[, checkpoint folder]); returns rank -> results, one per job."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    procs = [context.Process(target=distributed_worker.run, args=(rank, 2, port, jobs, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        rank, results, error = queue.get(timeout=600)
        assert error is None, f"rank {rank}: {error}"
        out[rank] = torch.load(io.BytesIO(results))
    for p in procs:
        p.join(timeout=60)
    return out


def _differences(a: dict, b: dict) -> list[str]:
    """What differs between two ranks' results: the loss, a gradient's presence or a gradient's values."""
    found = [] if torch.equal(a["loss"], b["loss"]) else ["loss"]
    if a["grads"].keys() != b["grads"].keys() or not a["grads"]:
        return found + ["the set of parameters with a gradient"]
    return found + [name for name in a["grads"] if not torch.equal(a["grads"][name], b["grads"][name])]


def test_ddp_patched_equals_stock_with_different_layouts_per_rank():
    layouts = {0: "image+video", 1: "images"}
    out = _run([("ddp", "stock", layouts), ("ddp", "patched", layouts)])
    for rank in (0, 1):
        assert _differences(out[rank][0], out[rank][1]) == []


def test_fsdp2_patched_equals_stock_and_the_state_dict_is_unchanged():
    layouts = {0: "image+video", 1: "image+video-2"}  # (stock FSDP2 needs both modalities on both ranks)
    out = _run([("fsdp2", "stock", layouts), ("fsdp2", "patched", layouts)])
    for rank in (0, 1):
        stock, patched = out[rank]
        assert _differences(stock, patched) == []
        assert stock["state"].keys() == patched["state"].keys()
        assert all(torch.equal(stock["state"][k], patched["state"][k]) for k in stock["state"])


def test_fsdp2_checkpoint_of_a_patched_model_round_trips(tmp_path):
    layouts = {0: "image+video", 1: "image+video-2"}
    out = _run([("fsdp2", "patched", layouts, str(tmp_path / "checkpoint"))])
    for rank in (0, 1):
        reloaded = out[rank][0]["reloaded"]
        assert reloaded["patched"] and reloaded["saved"].keys() == reloaded["loaded"].keys()
        assert all(torch.equal(reloaded["saved"][k], reloaded["loaded"][k]) for k in reloaded["saved"])


def test_fsdp2_text_only_rank_stays_in_step_and_equals_the_dummy_forward_workaround():
    layouts = {0: "image+video", 1: "text-only"}
    out = _run([("fsdp2", "dummy", layouts), ("fsdp2", "patched+vision", layouts)])
    for rank in (0, 1):
        assert _differences(out[rank][0], out[rank][1]) == []
