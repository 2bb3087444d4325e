"""Every rule of the table, positive and negative, on the emulated device.

Each positive case must record exactly one host sync, from the op its rule names;
each negative case must record none. The two tables in ``rules.py`` must be covered
in full, so a rule added without a test fails here.
"""

from __future__ import annotations

import pytest
import torch

from syncfree.audit import rules

CUDA = "cuda"


def _x():
    return torch.arange(6, device=CUDA)


def _mask():
    return _x() > 2


POSITIVE = {
    "aten::_local_scalar_dense": lambda: _x().sum().item(),
    "aten::nonzero": lambda: _mask().nonzero(),
    "aten::masked_select": lambda: _x().masked_select(_mask()),
    "aten::index.Tensor": lambda: _x()[_mask()],
    "aten::index_put_": lambda: _x().index_put_((_mask(),), torch.zeros((), dtype=torch.long, device=CUDA)),
    "aten::_index_put_impl_": lambda: torch.ops.aten._index_put_impl_(
        _x(), [_mask()], torch.zeros(3, dtype=torch.long, device=CUDA)
    ),
    "aten::_unique": lambda: torch._unique(_x()),
    "aten::_unique2": lambda: torch.unique(_x()),
    "aten::unique_dim": lambda: torch.unique(_x().view(2, 3), dim=0),
    "aten::unique_consecutive": lambda: torch.unique_consecutive(_x()),
    "aten::unique_dim_consecutive": lambda: torch.ops.aten.unique_dim_consecutive(_x().view(2, 3), 0),
    "aten::repeat_interleave.Tensor": lambda: torch.repeat_interleave(_x(), _x()),
    "aten::bincount": lambda: torch.bincount(_x()),
    "aten::histc": lambda: torch.histc(_x().float()),
    "aten::equal": lambda: torch.equal(_x(), _x()),
    "aten::_grouped_mm": lambda: _grouped_mm(torch.float32),
    # Backward ops: their syncs are counted in the backward phase (the forward may sync on its own).
    "aten::index_put": lambda: _backward(lambda w: w[_mask()]),
    "aten::masked_scatter_backward": lambda: _backward(
        lambda w: torch.zeros(6, device=CUDA).masked_scatter(_mask(), w)),
}


def _backward(forward, n: int = 6):
    w = torch.ones(n, device=CUDA, requires_grad=True)
    forward(w).sum().backward()
    assert w.grad is not None and w.grad.device.type == "cuda"  # the backward did run, on the device


def _embedding(n_indices: int):
    weight = torch.ones(10, 4, device=CUDA, requires_grad=True)
    indices = torch.arange(n_indices, device=CUDA) % 10
    torch.nn.functional.embedding(indices, weight).sum().backward()
    assert weight.grad is not None


def _cross_entropy():
    logits = torch.ones(6, 5, device=CUDA, requires_grad=True)
    target = torch.tensor([1, -100, 2, 3, -100, 0]).to(CUDA)
    torch.nn.functional.cross_entropy(logits, target, ignore_index=-100).backward()
    assert logits.grad is not None


def _grouped_mm(dtype):
    a, b = torch.ones(10, 16, dtype=dtype, device=CUDA), torch.ones(3, 16, 16, dtype=dtype, device=CUDA)
    return torch._grouped_mm(a, b, torch.tensor([4, 4, 10], dtype=torch.int32, device=CUDA))

# Python-level ways to read a device value, each one sync through _local_scalar_dense.
SCALAR_READS = {
    "int()": lambda: int(_x()[1]),
    "float()": lambda: float(_x()[1]),
    "bool()": lambda: bool(_x()[1]),
    "if t:": lambda: 1 if _x()[1] else 0,
    "__index__": lambda: [0, 1, 2][_x()[1]],
    "max() of tensors": lambda: max(_x()[1], _x()[2]),
    "a tensor as a size": lambda: torch.zeros(_x()[2], device=CUDA),
}

PYTHON_POSITIVE = {
    "Tensor.tolist": lambda: _x().tolist(),
    "Tensor.__repr__": lambda: f"{_x().sum()}",
    "torch.tensor": lambda: torch.tensor([_x()[0]]),
    "torch.cuda.synchronize": lambda: torch.cuda.synchronize(),
}


def _masked_scatter():
    x = _x()
    x.masked_scatter_(_mask(), torch.zeros(6, dtype=torch.long, device=CUDA))


NEGATIVE = {
    "aten::masked_fill_": lambda: _x().masked_fill_(_mask(), 0),
    "aten::index_put_ (x[mask] = python_scalar)": lambda: _x().__setitem__(_mask(), 0),
    "aten::masked_scatter": lambda: _x().masked_scatter(_mask(), torch.zeros(6, dtype=torch.long, device=CUDA)),
    "aten::masked_scatter_": _masked_scatter,
    "aten::cumsum": lambda: _x().cumsum(0),
    "aten::searchsorted": lambda: torch.searchsorted(_x(), _x()),
    "aten::index_select": lambda: _x().index_select(0, _x()[:2]),
    "aten::index_copy_": lambda: _x().index_copy_(0, _x()[:2], _x()[:2]),
    "aten::index_add_": lambda: _x().index_add_(0, _x()[:2], _x()[:2]),
    "aten::scatter_": lambda: _x().scatter_(0, _x()[:2], _x()[:2]),
    "aten::gather": lambda: _x().gather(0, _x()[:2]),
    "aten::nonzero_static": lambda: torch.nonzero_static(_mask(), size=6),
    "aten::repeat_interleave.Tensor (output_size=n)": lambda: torch.repeat_interleave(_x(), _x(), output_size=15),
    "aten::_grouped_mm (bfloat16)": lambda: _grouped_mm(torch.bfloat16),
    "aten::embedding_dense_backward": lambda: (_embedding(64), _embedding(4000)),  # both sides of 3072
    "aten::nll_loss_forward (ignore_index, mean)": _cross_entropy,
    "aten::nll_loss_backward": _cross_entropy,
    "aten::masked_select_backward": lambda: _backward(lambda w: w.masked_select(_mask())),
    "aten::index_select_backward / aten::index_add_": lambda: _backward(lambda w: w.index_select(0, _x()[:2])),
}

_BACKWARD = {op for op in {*POSITIVE, *NEGATIVE} if "backward" in op or op == "aten::index_put"}


def _syncs(report, op):
    """The syncs a case is about: for a backward op, those of the backward phase."""
    return [e for e in report.syncs if op not in _BACKWARD or e.phase == "backward"]


def test_every_rule_has_a_positive_and_every_negative_case_a_test():
    assert set(POSITIVE) == set(rules.SYNC_RULES)
    assert set(PYTHON_POSITIVE) == set(rules.PYTHON_SYNC_RULES)
    assert set(NEGATIVE) == set(rules.NO_SYNC)


@pytest.mark.parametrize("op", sorted(POSITIVE))
def test_positive_rule_records_exactly_one_sync_from_its_op(emulated, op):
    report = emulated(POSITIVE[op])
    assert [e.op for e in _syncs(report, op)] == [op]
    assert _syncs(report, op)[0].reason == rules.SYNC_RULES[op].reason


@pytest.mark.parametrize("how", sorted(SCALAR_READS))
def test_python_scalar_reads_sync(emulated, how):
    report = emulated(SCALAR_READS[how])
    assert len(report.syncs) >= 1
    assert {e.op for e in report.syncs} == {"aten::_local_scalar_dense"}


@pytest.mark.parametrize("api", sorted(PYTHON_POSITIVE))
def test_python_level_rules_sync(emulated, api):
    report = emulated(PYTHON_POSITIVE[api])
    assert len(report.syncs) == 1
    assert report.syncs[0].reason == rules.PYTHON_SYNC_RULES[api]


@pytest.mark.parametrize("op", sorted(NEGATIVE))
def test_negative_case_records_no_sync(emulated, op):
    report = emulated(NEGATIVE[op])
    assert _syncs(report, op) == []


def test_boolean_mask_write_of_a_scalar_does_not_sync_but_of_a_device_tensor_does(emulated):
    def scalar():
        x = _x()
        x[_mask()] = 0

    def tensor():
        x = _x()
        x[_mask()] = torch.zeros(3, dtype=torch.long, device=CUDA)

    assert emulated(scalar).syncs == []
    assert [e.op for e in emulated(tensor).syncs] == ["aten::index_put_"]


def test_histc_with_a_given_range_does_not_sync(emulated):
    assert emulated(lambda: torch.histc(_x().float(), bins=4, min=0, max=6)).syncs == []


def test_ops_on_host_tensors_record_nothing(emulated):
    def host_only():
        x = torch.arange(6)
        x[x > 2].tolist()
        torch.repeat_interleave(x, x)

    assert emulated(host_only).events == []


def test_boolean_mask_from_the_host_indexes_without_a_sync_but_copies_it(emulated):
    report = emulated(lambda: _x()[torch.arange(6) > 2])
    assert report.syncs == []
    assert [(e.kind, e.blocking) for e in report.copies] == [("h2d", True)]
