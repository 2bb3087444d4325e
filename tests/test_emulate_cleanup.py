"""What ``emulate_cuda()`` leaves behind (issue 22, part 6): cleanup after a failed forward never buries the
user's error, and no emulated tensor outlives the context in a module's state."""

from __future__ import annotations

import copy

import pytest
import torch

from syncfree.audit import emulate_cuda
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import build_model


@pytest.fixture(scope="module")
def model_and_batch():
    model = build_model("qwen3-vl-tiny")
    return model, build_inputs(model.config, named_layout("image", 64))


def _error(fn) -> BaseException:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 -- what was raised is the point
        return err
    pytest.fail("no exception")


def test_moving_the_model_back_after_a_forward_that_raised_with_grad_shows_the_users_error(model_and_batch):
    """``finally: model.to("cpu")`` after a forward that raised with grad enabled: the autograd graph the
    in-flight exception still holds made the parameter swap fail ("Couldn't swap Conv3d.weight"), which hid
    the forward's own error and left every parameter on the emulated device."""
    model, batch = model_and_batch
    bad = {**batch, "pixel_values": batch["pixel_values"][:-4]}  # fewer patches than the grid says
    with torch.no_grad():  # (a graph kept by this error would hold the parameters too)
        expected = _error(lambda: model(**bad))  # on the CPU, no emulation

    def run():
        with emulate_cuda():
            model.to("cuda")
            try:
                model(**{k: v.to("cuda") for k, v in bad.items()})
            finally:
                model.to("cpu")

    got = _error(run)
    assert type(got) is type(expected) and str(got) == str(expected)
    assert all(type(p) is torch.nn.Parameter and p.device.type == "cpu" for p in model.parameters())


def test_no_emulated_tensor_is_left_in_module_state_after_the_context(model_and_batch):
    """Stock caches ``rope_deltas`` on the model; ``model.to()`` does not move plain attributes, so it stayed an
    emulated tensor, which no op accepts outside the context (``copy.deepcopy(model)`` failed)."""
    model, batch = model_and_batch
    with torch.no_grad():
        model(**batch)
    on_cpu = model.model.rope_deltas.clone()
    with emulate_cuda(), torch.no_grad():
        model.to("cuda")
        model(**{k: v.to("cuda") for k, v in batch.items()})
        model.to("cpu")
    assert type(model.model.rope_deltas) is torch.Tensor and torch.equal(model.model.rope_deltas, on_cpu)
    copy.deepcopy(model)
