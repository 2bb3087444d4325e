"""Training on the emulated device: backward, checkpointing and optimizers run, equal a plain CPU run,
and their syncs are labelled by phase and attributed to the forward line that made them."""

from __future__ import annotations

import functools
import threading

import pytest
import torch

import syncfree
from family_checks import checkpointing
from syncfree.audit import emulate_cuda
from syncfree.compare.train import labels_for
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import PRESETS, build_model, load_config

FAMILY_PRESETS = ("qwen2-vl-tiny", "qwen2.5-vl-tiny", "qwen3-vl-tiny", "qwen3-vl-moe-tiny")


def _batch(preset: str, layout: str = "mixed") -> dict:
    config = load_config(preset)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    batch = build_inputs(config, named_layout(layout, 2 * unit, unit), pad_token_id=PRESETS[preset].pad_token_id)
    batch["labels"] = labels_for(batch)
    return batch


def _model(preset: str, grad_ckpt: str | None = None):
    model = build_model(preset, attn="sdpa", dtype=torch.float32, seed=0).train()
    if grad_ckpt:
        checkpointing(model, {"use_reentrant": grad_ckpt == "reentrant"})
    return model


def _grads(model) -> dict:
    return {n: p.grad.detach().to("cpu") for n, p in model.named_parameters() if p.grad is not None}


def _cpu_step(preset: str, batch: dict, grad_ckpt: str | None = None):
    model = _model(preset, grad_ckpt)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), _grads(model)


def _emulated_step(preset: str, batch: dict, grad_ckpt: str | None = None):
    model = _model(preset, grad_ckpt)
    with emulate_cuda(), syncfree.audit() as report:
        model.to("cuda")
        loss = model(**{k: v.to("cuda") for k, v in batch.items()}).loss
        loss.backward()
        loss, grads = loss.detach().to("cpu"), _grads(model)
        model.to("cpu")
    return loss, grads, report


# A stated tolerance for gradients, on PyTorch releases where some derivative formula takes its composite
# form when a tensor subclass is involved (2.13: silu's backward is sigmoid/mul arithmetic instead of the
# fused silu_backward kernel; see test_silu_backward_is_exact_unless_its_formula_branches_on_subclasses),
# as the emulated device's tensors are a subclass. Elsewhere (2.14) gradients are compared bit for bit.
# Forwards and losses are bit-identical everywhere.
GRAD_TOLERANCE = dict(rtol=1e-5, atol=1e-7)


@functools.lru_cache(maxsize=None)
def _silu_backward_branches() -> bool:
    """Whether this PyTorch takes silu's composite derivative for tensor subclasses (2.13 does, 2.14 not)."""
    with emulate_cuda(), syncfree.audit() as report:
        _chain_grad(torch.nn.functional.silu, "cuda")
    return "aten::silu_backward" not in report.launch_ops


def _assert_same(cpu: tuple, emulated: tuple) -> None:
    assert torch.equal(cpu[0], emulated[0])
    assert cpu[1].keys() == emulated[1].keys() and cpu[1]
    for name, grad in cpu[1].items():
        if _silu_backward_branches():
            torch.testing.assert_close(emulated[1][name], grad, **GRAD_TOLERANCE, msg=name)
        else:  # every derivative formula these models use is the plain CPU one: bit for bit
            assert torch.equal(emulated[1][name], grad), name


def _chain_grad(activation, device: str) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(4, 33).to(device).requires_grad_()
    activation(x * 1.5).sum().backward()
    return x.grad.to("cpu")


@pytest.mark.parametrize("activation", [torch.tanh, torch.nn.functional.gelu, torch.exp], ids=["tanh", "gelu", "exp"])
def test_backward_of_plain_derivative_formulas_is_bit_identical(activation):
    with emulate_cuda():
        emulated = _chain_grad(activation, "cuda")
    assert torch.equal(_chain_grad(activation, "cpu"), emulated)


def test_silu_backward_is_exact_unless_its_formula_branches_on_subclasses():
    # Some PyTorch releases (2.13) pick silu's composite derivative (sigmoid/mul arithmetic) for tensor
    # subclasses instead of the fused silu_backward kernel: the reason for GRAD_TOLERANCE. Where the fused
    # kernel runs (2.14), the gradient is bit-identical.
    with emulate_cuda(), syncfree.audit() as report:
        emulated = _chain_grad(torch.nn.functional.silu, "cuda")
    plain = _chain_grad(torch.nn.functional.silu, "cpu")
    if "aten::silu_backward" in report.launch_ops:
        assert torch.equal(emulated, plain)
    else:
        assert "aten::sigmoid" in report.launch_ops
        torch.testing.assert_close(emulated, plain, **GRAD_TOLERANCE)


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_backward_gradients_equal_a_plain_cpu_run(preset):
    batch = _batch(preset)
    _assert_same(_cpu_step(preset, batch), _emulated_step(preset, batch)[:2])


@pytest.mark.parametrize("grad_ckpt", ["reentrant", "non-reentrant"])
def test_checkpointing_recompute_equals_cpu_and_is_labelled_recompute(grad_ckpt):
    batch = _batch("qwen3-vl-tiny")
    loss, grads, report = _emulated_step("qwen3-vl-tiny", batch, grad_ckpt)
    _assert_same(_cpu_step("qwen3-vl-tiny", batch, grad_ckpt), (loss, grads))
    # Stock's vision split reads lengths.tolist() again in every recomputed vision block.
    recomputed = [e for e in report.syncs if e.phase == "recompute"]
    assert recomputed and all("lengths.tolist()" in e.where.code for e in recomputed)
    assert {e.phase for e in report.syncs} == {"forward", "recompute", "backward"}


def _linear_step(optimizer_kwargs: dict, device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, **optimizer_kwargs)
    x = torch.randn(16, 8).to(device)
    for _ in range(2):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("kwargs", [{}, {"foreach": True}, {"foreach": False}, {"fused": True}],
                         ids=["default", "foreach", "single-tensor", "fused"])
def test_optimizer_steps_equal_a_plain_cpu_run(kwargs):
    with emulate_cuda():
        with syncfree.audit() as report:
            on_device = _linear_step(kwargs, "cuda")
        emulated = [p.to("cpu") for p in on_device]
    for a, b in zip(_linear_step(kwargs, "cpu"), emulated):
        assert torch.equal(a, b)
    assert report.syncs == []
    if not kwargs:  # PyTorch's default for CUDA tensors is the foreach implementation
        assert any(op.startswith("aten::_foreach_") for op in report.launch_ops)


def test_autograd_grad_equals_cpu():
    def grad(device):
        w = torch.linspace(-1, 1, 12).reshape(3, 4).to(device).requires_grad_()
        (g,) = torch.autograd.grad(torch.tanh(w @ w.T).sum(), w)
        return g.to("cpu")

    with emulate_cuda():
        emulated = grad("cuda")
    assert torch.equal(grad("cpu"), emulated)


def _scatter_then_backward():
    source = torch.ones(4, device="cuda", requires_grad=True)
    mask = torch.arange(6, device="cuda") % 2 == 0
    out = torch.zeros(6, device="cuda").masked_scatter(mask, source)  # the forward line
    out.sum().backward()


def test_a_backward_sync_is_attributed_to_the_forward_line_that_made_it(emulated):
    report = emulated(_scatter_then_backward)
    (event,) = report.syncs
    assert (event.op, event.phase) == ("aten::masked_scatter_backward", "backward")
    assert event.where.function == "_scatter_then_backward"
    assert event.where.code.endswith("# the forward line")


def test_gradient_clipping_syncs_are_labelled_optimizer(emulated):
    def clip():
        w = torch.ones(3, device="cuda", requires_grad=True)
        (w * 2).sum().backward()
        torch.nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)  # checks the norm on the host

    phases = [e.phase for e in emulated(clip).syncs]
    assert phases and set(phases) == {"optimizer"}


def test_backward_on_two_threads_each_audits_its_own():
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def work(name: str, n: int):
        try:
            with emulate_cuda():
                with syncfree.audit() as report:
                    barrier.wait()
                    w = torch.ones(n, device="cuda", requires_grad=True)
                    w[w > 0].sum().backward()  # one sync forward, one backward
                results[name] = (report, w.grad.to("cpu"))
        except Exception as err:  # noqa: BLE001  (reported below)
            errors.append(err)

    threads = [threading.Thread(target=work, args=(name, n)) for name, n in (("a", 3), ("b", 5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for name, n in (("a", 3), ("b", 5)):
        report, grad = results[name]
        assert [e.phase for e in report.syncs] == ["forward", "backward"]
        assert torch.equal(grad, torch.ones(n))


def test_training_inside_leaves_nothing_behind():
    import torch.optim.optimizer as optimizer_module

    before = (torch.is_anomaly_enabled(), list(optimizer_module._foreach_supported_types),
              torch.autograd._engine_run_backward, torch.cuda.is_available())
    with emulate_cuda():
        w = torch.ones(2, device="cuda", requires_grad=True)
        (w * 3).sum().backward()
    after = (torch.is_anomaly_enabled(), list(optimizer_module._foreach_supported_types),
             torch.autograd._engine_run_backward, torch.cuda.is_available())
    assert before == after
    x = torch.ones(2, requires_grad=True)  # and a plain CPU backward still works
    (x * 3).sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 3.0))
