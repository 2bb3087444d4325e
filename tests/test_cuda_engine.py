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
        "import json, torch; from syncfree.compare.forward import AuditSpec, run_audit\n"
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


# ---- the engine's own logic, without a device: its hooks are fed what CUDA would send them ----

def _waits(monkeypatch):
    """A _HostWaits wired to a plain list, with torch.cuda.synchronize a stand-in that only counts."""
    from syncfree.audit.cuda_engine import _CallTracker, _HostWaits

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    events = []
    tracker = _CallTracker(SimpleNamespace(add=events.append))
    return _HostWaits(events.append, tracker), tracker, events, calls


def test_cuda_sync_warnings_become_sync_events_at_the_calling_line(monkeypatch):
    import warnings

    waits, tracker, events, _ = _waits(monkeypatch)
    waits.install()
    try:
        tracker.api = "Tensor.tolist"
        warnings.warn("called a synchronizing CUDA operation"); line = sys._getframe().f_lineno  # noqa: E702
        warnings.warn("called a synchronizing CUDA operation")  # "always": the second is not deduplicated
    finally:
        waits.uninstall()
        tracker.api = None
    assert [e.kind for e in events] == ["sync", "sync"]
    assert events[0].api == "Tensor.tolist" and events[0].engine == "cuda"
    assert (events[0].where.filename, events[0].where.lineno) == (__file__, line)


def test_cuda_sync_warning_inside_a_recorded_copy_is_not_counted_twice(monkeypatch):
    import warnings

    waits, tracker, events, _ = _waits(monkeypatch)
    waits.install()
    try:
        tracker.in_copy = True
        warnings.warn("called a synchronizing CUDA operation")
    finally:
        waits.uninstall()
    assert events == []


def test_other_warnings_pass_through_the_cuda_engine(monkeypatch):
    import warnings

    waits, _, events, _ = _waits(monkeypatch)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        waits.install()
        try:
            warnings.warn("something else entirely")
        finally:
            waits.uninstall()
    assert events == []
    assert [str(w.message) for w in seen] == ["something else entirely"]


def test_device_wide_synchronize_is_a_sync_event_and_still_waits(monkeypatch):
    # CUDA's sync debug mode does not see cudaDeviceSynchronize, so the engine wraps the Python call.
    waits, _, events, calls = _waits(monkeypatch)
    stand_in = torch.cuda.synchronize
    waits.install()
    try:
        torch.cuda.synchronize()
    finally:
        waits.uninstall()
    assert calls == [None]  # the real synchronize still ran
    assert [(e.kind, e.api) for e in events] == [("sync", "torch.cuda.synchronize")]
    assert torch.cuda.synchronize is stand_in  # and is back after the audit


@pytest.mark.parametrize("call, expected", [
    ((torch.Tensor.to, (torch.ones(2), "cuda"), {}), ("h2d", False)),
    ((torch.Tensor.to, (torch.ones(2), "cuda"), {"non_blocking": True}), ("h2d", True)),
    ((torch.Tensor.to, (torch.ones(2), torch.float64), {}), None),
    ((torch.Tensor.to, (torch.ones(2), "cpu"), {}), None),
    ((torch.Tensor.cuda, (torch.ones(2),), {"non_blocking": True}), ("h2d", True)),
    ((torch.tensor, ([1, 2],), {"device": "cuda"}), ("h2d", False)),
    ((torch.tensor, ([1, 2],), {}), None),
])
def test_copies_are_recognised_from_the_python_call(call, expected):
    from syncfree.audit.cuda_engine import _copy_kind

    got = _copy_kind(*call)
    assert (None if got is None else (got[0], got[2])) == expected


# ---- the GPU script's cross-check, run on two emulated engines: its plumbing, without a GPU ----

CROSS_CHECK = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu", "cross_check.py")


def _cross_check(tmp_path, *args):
    out = tmp_path / "cc.json"
    proc = subprocess.run([sys.executable, CROSS_CHECK, "--out", str(out), "--engines", "emulated", "emulated",
                           "--inputs", "mixed", *args], capture_output=True, text=True, timeout=300)
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_cross_check_agrees_with_itself_and_counts_every_variant(tmp_path):
    proc, data = _cross_check(tmp_path, "--models", "qwen3-vl-tiny")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [entry] = data["results"]
    assert data["lines_that_differ"] == 0 and entry["errors"] == {}
    syncs = {v: entry["variants"][v]["syncs"] for v in ("stock", "patched", "patched+prepare")}
    assert syncs["stock"][0] == syncs["stock"][1] > 0
    assert syncs["patched"] == [1, 1] and syncs["patched+prepare"] == [0, 0]


def test_cross_check_reports_a_failing_pair_and_exits_non_zero(tmp_path):
    proc, data = _cross_check(tmp_path, "--models", "no-such-preset")
    assert proc.returncode == 1
    [entry] = data["results"]
    assert set(entry["errors"]) == {"emulated1", "emulated2"}
    assert "no-such-preset" in entry["errors"]["emulated1"]


def test_cross_check_compare_lists_lines_whose_counts_differ():
    sys.path.insert(0, os.path.dirname(CROSS_CHECK))
    try:
        from cross_check import compare
    finally:
        sys.path.pop(0)
    real = {"lines": {"stock": ["a.py:1", "a.py:1", "b.py:2"], "patched": ["h.py:9"]}}
    emulated = {"lines": {"stock": ["a.py:1", "b.py:2", "c.py:3"], "patched": ["h.py:9"]}}
    got = compare(real, emulated)
    assert got["stock"] == {"syncs": [3, 3], "differ": {"a.py:1": [2, 1], "c.py:3": [0, 1]}}
    assert got["patched"]["differ"] == {} and got["patched+prepare"]["syncs"] == [0, 0]


INDEXES = {
    "host long tensor": lambda: torch.tensor([0, 2]),
    "host bool mask": lambda: torch.tensor([True, False, True, False]),
    "slice and host tensor": lambda: (slice(None), torch.tensor([1, 3])),
    "two host tensors": lambda: (torch.tensor([0, 1]), torch.tensor([2, 3])),
    "python list": lambda: [0, 2],
    "nested python list (read as a tuple)": lambda: [[0, 1], [1, 2]],
    "list holding a slice and a list (read as a tuple)": lambda: [slice(None), [1, 3]],
    "0-dim host tensor (an integer)": lambda: torch.tensor(1),
    "ints, slices, None, Ellipsis": lambda: (Ellipsis, None, 3),
}


@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence")  # PyTorch's own, for the list-as-tuple cases
@pytest.mark.parametrize("name", sorted(INDEXES))
def test_real_engine_counts_the_host_index_copies_the_emulator_records(name):
    # On CUDA these copies are blocking (with a stream sync the engine must not count as a second event):
    # the real engine recognises them from the Python index, the emulator from the CPU tensors reaching
    # the device's index kernels. Both must count the same.
    from syncfree.audit import emulate_cuda
    from syncfree.audit.cuda_engine import cpu_indices

    index = INDEXES[name]()
    host = torch.arange(24).view(4, 6)
    with emulate_cuda():
        x = torch.arange(24, device="cuda").view(4, 6)
        with audit() as report:
            got = x[index].clone()  # (basic indexing gives a view, which the write below changes)
            x[index] = -1
        got, x = got.cpu(), x.cpu()
    recorded = [e for e in report.copies if e.kind == "h2d" and e.blocking]
    assert len(recorded) == 2 * len(cpu_indices(index))  # the read and the write
    assert torch.equal(got, host[index])
    host[index] = -1
    assert torch.equal(x, host)
