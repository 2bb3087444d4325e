"""Qwen3.5's text model on a padding-free packed batch: the gated-DeltaNet kernels' call sites, audited.

The packed path needs flash-linear-attention (Transformers 5.24 refuses packed input to its PyTorch
reference), which has no CPU build; stand-ins (tests/standins) take its place and record what they are
handed. What matters is around them: the cumulative lengths they get are the batch's device tensor (no
host read builds them), and the forward makes no sync with prepare(). Stock asks once per forward
whether the batch is packed (Transformers' find_packed_sequence_indices); the patched forward answers
that from the plan's host copy of the position ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5", reason="this Transformers release has no Qwen3.5")
HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def packed():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "standins"), HERE,
                                                       os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, os.path.join(HERE, "packed_worker.py")], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_kernels_get_the_batchs_device_lengths_in_every_linear_attention_layer(packed):
    for variant in ("stock", "patched", "patched+prepare"):
        calls = packed[variant]["chunk_calls"]
        assert len(calls) == packed["linear_layers"]
        assert all(c["cu_seqlens"] == ["DeviceTensor", "cuda:0"] for c in calls)
        # (Transformers hands causal-conv1d no seq_idx for a packed batch: its convolution spans the joins.)
        assert len(packed[variant]["conv_calls"]) == packed["linear_layers"]


def test_prepared_packed_forward_has_no_sync_and_equals_stock(packed):
    assert packed["patched+prepare"]["syncs"] == [] and packed["patched+prepare"]["blocking"] == 0
    assert all(packed[v]["equal"] for v in ("stock", "patched", "patched+prepare"))


def test_stock_asks_once_whether_the_batch_is_packed(packed):
    assert [line.split(":")[0] for line in packed["stock"]["syncs"]] == ["transformers/masking_utils.py"]
    assert len(packed["patched"]["syncs"]) <= 1
