"""The emulated device: copies, device checks, source lines, bit-identity, and its failure modes."""

from __future__ import annotations

import sys

import pytest
import torch

import syncfree
from syncfree.audit import DeviceTensor, EmulationUnavailable, audit, emulate_cuda, guard_shim


def test_tensors_on_cuda_report_the_cuda_device_and_hold_cpu_data():
    with emulate_cuda():
        x = torch.arange(4, device="cuda")
        y = torch.ones(2).to("cuda")
        assert x.device == torch.device("cuda", 0) and x.is_cuda
        assert isinstance(y, DeviceTensor) and y.elem.device.type == "cpu"
        assert (x + 1).device.type == "cuda"
        assert x.cpu().device.type == "cpu"


def test_blocking_host_to_device_copy_is_a_blocking_copy_not_a_sync(emulated):
    report = emulated(lambda: torch.tensor([1, 2], device="cuda"))
    assert report.syncs == []
    assert [(e.kind, e.blocking, e.nbytes) for e in report.copies] == [("h2d", True, 16)]


def test_pinned_non_blocking_copy_neither_syncs_nor_blocks(emulated):
    def copy():
        host = torch.ones(8).pin_memory()
        assert host.is_pinned()
        host.to("cuda", non_blocking=True)

    report = emulated(copy)
    assert report.syncs == [] and report.blocking_copies == []
    assert [(e.kind, e.pinned, e.blocking) for e in report.copies] == [("h2d", True, False)]


def test_pageable_non_blocking_copy_still_blocks(emulated):
    report = emulated(lambda: torch.ones(8).to("cuda", non_blocking=True))
    assert [(e.kind, e.pinned, e.blocking) for e in report.copies] == [("h2d", False, True)]


def test_copy_to_the_host_waits_unless_non_blocking(emulated):
    blocking = emulated(lambda: torch.ones(3, device="cuda").cpu())
    assert [(e.kind, e.waits) for e in blocking.syncs] == [("d2h", True)]
    asynchronous = emulated(lambda: torch.ones(3, device="cuda").to("cpu", non_blocking=True))
    assert asynchronous.syncs == []
    assert [(e.kind, e.blocking) for e in asynchronous.copies] == [("d2h", False)]


def test_copy_into_existing_tensors_is_recorded_in_both_directions(emulated):
    def copies():
        dev = torch.zeros(4, device="cuda")
        dev.copy_(torch.ones(4).pin_memory(), non_blocking=True)
        host = torch.empty(4)
        host.copy_(dev)

    report = emulated(copies)
    assert [(e.kind, e.blocking) for e in report.copies] == [("h2d", False), ("d2h", True)]


def test_empty_copies_are_not_recorded(emulated):
    # CUDA skips copying an empty tensor (Transformers' DynamicCache makes such tensors).
    assert emulated(lambda: torch.tensor([], device="cuda")).events == []


def test_mixing_a_device_tensor_with_a_host_tensor_raises_like_cuda():
    with emulate_cuda():
        x = torch.ones(3, device="cuda")
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            x + torch.ones(3)
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            torch.nn.functional.scaled_dot_product_attention(x.view(1, 1, 3, 1), x.view(1, 1, 3, 1),
                                                             torch.ones(1, 1, 3, 1))
        # A 0-dim host tensor is a scalar, which CUDA accepts too.
        assert torch.equal((x + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))


def test_event_names_the_source_line_and_the_call_chain(emulated):
    def inner():
        return torch.ones(2, device="cuda").tolist()

    def outer():
        return inner()

    line = inner.__code__.co_firstlineno + 1
    report = emulated(outer)
    (event,) = report.syncs
    assert event.where.filename == __file__ and event.where.lineno == line
    assert [f.function for f in event.stack[:2]] == ["inner", "outer"]
    assert event.api == "Tensor.tolist"


def test_results_are_bit_identical_to_a_plain_cpu_run():
    # (nn.TransformerEncoderLayer would not do: its fused fast path turns itself off for tensor
    # subclasses, so it takes another code path under emulation, as it would with any subclass.)
    torch.manual_seed(0)
    layer = torch.nn.Sequential(
        torch.nn.Conv1d(7, 7, 3, padding=1), torch.nn.LayerNorm(32), torch.nn.Linear(32, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 32), torch.nn.Softmax(-1),
    ).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        expected = layer(x)
        q = torch.randn(1, 2, 5, 8)
        expected_attn = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        with emulate_cuda():
            layer.to("cuda")
            got = layer(x.to("cuda"))
            qd = q.to("cuda")
            got_attn = torch.nn.functional.scaled_dot_product_attention(qd, qd, qd, is_causal=True)
            assert torch.equal(got.cpu(), expected)
            assert torch.equal(got_attn.cpu(), expected_attn)


def test_model_to_cuda_keeps_parameters_and_tied_weights():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    with emulate_cuda():
        model.to("cuda")
        assert isinstance(model[0].weight, torch.nn.Parameter)
        assert model[0].weight.device.type == "cuda"
        assert model[1].weight is model[0].weight
        assert [n for n, _ in model.named_parameters()] == ["0.weight"]


def test_device_tensors_cannot_be_used_outside_the_context():
    with emulate_cuda():
        x = torch.ones(2, device="cuda")
    with pytest.raises(RuntimeError, match="outside `with syncfree.emulate_cuda"):
        x + 1


def test_audit_without_gpu_or_emulation_explains_what_to_do():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the auto engine picks it")
    with pytest.raises(syncfree.CudaUnavailable, match="emulate_cuda"):
        with audit():
            pass
    with pytest.raises(syncfree.CudaUnavailable, match="needs a CUDA device"):
        with audit(engine="cuda"):
            pass


def test_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(guard_shim.FakeCudaGuard, "_lib", None)
    monkeypatch.setenv("SYNCFREE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmulationUnavailable, match="needs a C\\+\\+ compiler.*apt-get install g\\+\\+"):
        with emulate_cuda():
            pass
    # Nothing was left half-installed: CUDA's lazy init is the real one again.
    assert torch.cuda._lazy_init.__module__ == "torch.cuda"


def test_importing_syncfree_touches_neither_cuda_nor_modeling_modules():
    import subprocess

    code = (
        "import sys, torch, syncfree, syncfree.audit, syncfree.presets, syncfree.inputs, syncfree.cli\n"
        "assert not torch.cuda.is_initialized()\n"
        "bad = [m for m in sys.modules if '.modeling_' in m]\n"
        "assert not bad, bad\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr


def test_model_round_trip_to_cuda_and_back_gives_plain_parameters_still_tied():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    with emulate_cuda():
        model.to("cuda")
        model.to("cpu")
    assert type(model[0].weight) is torch.nn.Parameter and model[0].weight.device.type == "cpu"
    assert model[1].weight is model[0].weight
    assert model(torch.tensor([1, 2])).shape == (2, 10)


def test_grouped_mm_without_a_cpu_kernel_is_computed_group_by_group():
    # PyTorch <= 2.8 has no CPU kernel for _grouped_mm, which Transformers' MoE experts call on an sm_90 device.
    from syncfree.audit.cpu_kernel_gaps import CPU_KERNEL_GAPS

    def no_cpu_kernel(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_grouped_mm' with arguments from the 'CPU' backend")

    torch.manual_seed(0)
    a, b = torch.randn(10, 8), torch.randn(3, 8, 5)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)  # group 1 is empty
    got = CPU_KERNEL_GAPS["aten::_grouped_mm"](no_cpu_kernel, (a, b, offs), {})
    group = torch.bucketize(torch.arange(10), offs, right=True)
    want = torch.stack([a[r] @ b[g] for r, g in enumerate(group.tolist())])
    torch.testing.assert_close(got, want)
    with pytest.raises(NotImplementedError):  # a form it does not know is not guessed at
        CPU_KERNEL_GAPS["aten::_grouped_mm"](no_cpu_kernel, (a, b), {})


def test_torch_cuda_answers_as_one_available_sm90_device_inside_and_is_restored_after():
    from syncfree.audit import is_emulating, real_cuda_available

    real = {name: getattr(torch.cuda, name) for name in ("is_available", "get_device_properties",
                                                         "is_bf16_supported", "is_initialized")}
    available = torch.cuda.is_available()
    with emulate_cuda():
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        props = torch.cuda.get_device_properties(0)
        assert (props.major, props.minor) == (9, 0) == torch.cuda.get_device_capability()
        assert props.total_memory > 0 and props.multi_processor_count > 0 and "emulated" in props.name
        assert torch.cuda.is_bf16_supported()
        assert not torch.cuda.is_initialized()  # else torch.cuda's helpers would call the missing CUDA runtime
        torch.manual_seed(0)  # e.g. seeding, which queues a CUDA seed while not initialized
        assert is_emulating() and not real_cuda_available()
    assert torch.cuda.is_available() is available
    assert {name: getattr(torch.cuda, name) for name in real} == real
    if not available:
        assert not torch.cuda.is_available()


def test_inside_emulation_the_real_engine_is_refused_and_auto_picks_the_emulated_one():
    from syncfree.compare.forward import AuditSpec, run_audit

    with emulate_cuda():
        with pytest.raises(syncfree.CudaUnavailable, match="inside syncfree.emulate_cuda"):
            with audit(engine="cuda"):
                pass
        with audit() as report:
            torch.ones(2, device="cuda").tolist()
        assert report.engine == "emulated" and len(report.syncs) == 1
        stock, about = run_audit(AuditSpec(scope="rope", inputs="image"))  # engine="auto" inside emulate_cuda()
    assert about["engine"] == "emulated" and stock.syncs


def test_emulation_is_per_thread_and_nothing_is_left_behind():
    import threading

    results, errors = {}, []
    inside = threading.Barrier(2)

    def work(name: str, n: int):
        try:
            with emulate_cuda(), audit() as report:
                inside.wait(timeout=30)  # both threads emulate at once
                x = torch.arange(n, device="cuda")
                for _ in range(n):
                    x.sum().item()
                results[name] = (len(report.syncs), torch.cuda.device_count())
        except Exception as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=("a", 2)), threading.Thread(target=work, args=("b", 5))]
    for t in threads:
        t.start()
    seen_outside = []
    while any(t.is_alive() for t in threads):  # this thread is not emulating: it sees the real torch.cuda
        seen_outside.append((torch.cuda.is_available(), torch.cuda.device_count()))
        threads[0].join(0.01)
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == {"a": (2, 1), "b": (5, 1)}  # each audit heard only its own thread
    assert set(seen_outside) <= {(False, 0)}
    assert not torch.cuda.is_available() and torch.cuda._lazy_init.__module__ == "torch.cuda"
    with emulate_cuda():  # and the process can emulate again afterwards
        assert torch.cuda.is_available() and torch.ones(1, device="cuda").device.type == "cuda"
