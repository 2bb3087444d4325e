"""Hub kernels (the ``kernels`` package, which ``from_pretrained`` turns on by default from Transformers 5.25) and
syncfree composed in either order: the kernelized layers stay in force, the outputs equal stock kernelized, the
prepared forward makes no sync and traces as one graph. The kernel is a stand-in served from a local kernel
repository (``kernels.LocalLayerRepository``), so the replacement really happens on a CPU: an RMSNorm with stock's
arithmetic that counts its calls. (On a GPU the hub's own mapping: ``benchmarks/gpu/run.sh``.)"""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch

pytest.importorskip("kernels")

import syncfree  # noqa: E402
from syncfree.audit import audit, emulate_cuda  # noqa: E402
from syncfree.inputs import build_inputs, named_layout  # noqa: E402
from syncfree.presets import build_model  # noqa: E402

_LAYER = '''import torch

calls = [0]


class RMSNorm(torch.nn.Module):
    """Stock's RMSNorm arithmetic, counted."""

    def forward(self, hidden_states):
        calls[0] += 1
        dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(dtype)
'''


@pytest.fixture(scope="module")
def kernel_repo(tmp_path_factory):
    """A local kernel repository of one CPU build: ``metadata.json`` and the ``syncfree_stand_in`` package."""
    repo = tmp_path_factory.mktemp("kernel-repo")
    (repo / "metadata.json").write_text(json.dumps({"name": "syncfree-stand-in", "id": "syncfree_stand_in",
                                                    "version": 1, "license": "Apache-2.0", "python-depends": [],
                                                    "backend": {"type": "cpu"}}))
    package = repo / "syncfree_stand_in"
    package.mkdir()
    (package / "__init__.py").write_text("from . import layers\n")
    (package / "layers.py").write_text(_LAYER)
    return repo


def _kernelize(model, repo):
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping

    mapping = {"RMSNorm": {"cpu": LocalLayerRepository(repo, layer_name="RMSNorm")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    return model


def _calls() -> list:
    return importlib.import_module("syncfree_stand_in.layers").calls if "syncfree_stand_in.layers" in sys.modules \
        else [0]


@pytest.mark.parametrize("order", ["kernelize, then patch", "patch, then kernelize"])
def test_a_kernelized_model_keeps_its_kernels_and_stocks_outputs_when_patched(kernel_repo, order):
    batch = build_inputs(build_model("qwen3-vl-tiny").config, named_layout("mixed", side=64))
    stock = _kernelize(build_model("qwen3-vl-tiny").eval(), kernel_repo)
    _calls()[0] = 0
    with torch.no_grad():
        expected = stock(**batch).logits
    stock_calls = _calls()[0]
    assert stock_calls > 0, "the stand-in kernel did not replace the RMSNorm layers"

    model = build_model("qwen3-vl-tiny").eval()
    if order == "kernelize, then patch":
        syncfree.patch(_kernelize(model, kernel_repo))
    else:
        _kernelize(syncfree.patch(model), kernel_repo)
    assert syncfree.is_patched(model)
    _calls()[0] = 0
    with torch.no_grad():
        got = model(**syncfree.prepare(batch, "cpu", model)).logits
    assert _calls()[0] == stock_calls  # every kernelized layer still runs the kernel
    assert torch.equal(got, expected)

    with emulate_cuda():
        model.to("cuda")
        try:
            inputs = syncfree.prepare(batch, "cuda", model)
            with audit() as report, torch.no_grad():
                model(**inputs)
        finally:
            model.to("cpu")
            model.model.rope_deltas = None
    assert report.syncs == []


def test_a_kernelized_patched_model_traces_as_one_graph(kernel_repo):
    from torch._dynamo.testing import CompileCounter

    batch = build_inputs(build_model("qwen3-vl-tiny").config, named_layout("mixed", side=64))
    model = syncfree.patch(_kernelize(build_model("qwen3-vl-tiny").eval(), kernel_repo))
    prepared = syncfree.prepare(batch, "cpu", model)
    with torch.no_grad():
        expected = model(**prepared).logits
    counter = CompileCounter()
    _calls()[0] = 0
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True, backend=counter)(**syncfree.prepare(batch, "cpu", model)).logits
    assert counter.frame_count == 1 and _calls()[0] > 0
    assert torch.equal(got, expected)
