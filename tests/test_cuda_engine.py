"""The real-CUDA engine: what can be checked without a GPU, and the cross-check with one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from syncfree.audit import audit
from syncfree.audit.cuda_engine import count_memcpy
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import build_model


def test_profiler_memcpy_and_stream_syncs_are_counted_by_name():
    events = [SimpleNamespace(name=n) for n in (
        "Memcpy HtoD (Pageable -> Device)", "aten::add", "Memcpy DtoH (Device -> Pageable)",
        "Memcpy HtoD (Pageable -> Device)", "cudaStreamSynchronize", "cudaMemcpyAsync")]
    assert count_memcpy(events) == {"Memcpy HtoD (Pageable -> Device)": 2, "Memcpy DtoH (Device -> Pageable)": 1,
                                    "cudaStreamSynchronize": 1}


def _syncs_by_line(report) -> Counter:
    return Counter(e.line for e in report.syncs)


@pytest.mark.gpu
def test_real_and_emulated_engines_agree_on_syncs_by_line():
    # emulate_cuda() refuses to run beside a real GPU, so the emulated half runs in a process
    # that cannot see it.
    code = (
        "import json, torch; from syncfree.audit_run import AuditSpec, run_audit\n"
        "r, _ = run_audit(AuditSpec(inputs='mixed'), engine='emulated')\n"
        "print(json.dumps([e.line for e in r.syncs]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    emulated = Counter(json.loads(out.stdout.strip().splitlines()[-1]))
    model = build_model("qwen3-vl-tiny")
    batch = build_inputs(model.config, named_layout("mixed", 64))
    model.to("cuda")
    device_batch = {k: v.to("cuda") for k, v in batch.items()}
    with torch.no_grad():
        model(**device_batch)
        with audit("cuda") as report:
            model(**device_batch)
    assert _syncs_by_line(report) == emulated
