"""Never more device work than stock: for every fully supported family, the patched forward with inputs from
``syncfree.prepare`` issues no more aten ops than stock's forward on the same batch.

Two counts, each on the family's tiny census model: an independent one here, every aten op that does work on the
plain CPU (views, allocations and metadata queries left out; the plan's own checks count too, since on a CPU the
"device" is the host), and the auditor's kernel launches on the emulated CUDA device (what the census reports).
Layouts: the census's two images of different sizes, and one image of one merge block (the fewest per-image ops
stock can make, where a fixed cost of the plan would show).
"""

from __future__ import annotations

import collections
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import syncfree
from syncfree.audit import audit, emulate_cuda
from syncfree.census.run import OMNI_TINY, discover, tiny_model_and_batch
from syncfree.families import FAMILIES
from syncfree.inputs import Image, Text, batch_to, is_audio_only, processor_batch
from syncfree.plan.spec import ModelSpec

# Ops that make no values: a new header over the same storage (views are told by the op itself), an allocation,
# a question about the tensor.
_NO_WORK = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "alias", "lift_fresh",
            "lift_fresh_copy", "_local_scalar_dense", "is_nonzero", "set_", "resize_", "result_type", "is_same_size"}
# The tiny models that take longest on a CPU (reference kernels for linear attention, MoE experts, several towers):
# their checks run in the slow step.
SLOW = {"glm5_next", "qwen4_exp", "dots3_note", "muse_spark", "muse_glimmer", "minimax_m3_vl", "hy_v4_vl", "kimi_k25",
        "qwen3_omni_moe", "qwen2_5_omni", "qwen3_5_moe"}


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in _NO_WORK and not name.startswith("sym_"):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _families() -> list:
    supported = [f for f in discover() if f in FAMILIES or f in OMNI_TINY]
    return [pytest.param(f, id=f, marks=[pytest.mark.slow] if f in SLOW else []) for f in supported]


def _one_block_image(config) -> dict | None:
    """One image of one merge block, where the family takes images (None for an audio-only model)."""
    if is_audio_only(config) or config.model_type in OMNI_TINY:
        return None
    vc = config.vision_config
    merge = max(getattr(vc, "spatial_merge_size", 1) or 1, ModelSpec.from_config(config).spatial_merge_size)
    return processor_batch(config, [[Text(4), Image(vc.patch_size * merge, vc.patch_size * merge), Text(3)]])


def _ops(model, inputs: dict) -> int:
    with torch.no_grad(), _OpCounter() as counter:
        model(**inputs)
    return sum(counter.ops.values())


def _launches(model, batch: dict, prepared: bool) -> int:
    with emulate_cuda():
        model.to("cuda")
        try:
            inputs = syncfree.prepare(batch, "cuda", model) if prepared else batch_to(batch, "cuda")
            with audit() as report, torch.no_grad():
                model(**inputs)
        finally:
            model.to("cpu")
    return report.launches


@pytest.mark.parametrize("family", _families())
def test_the_prepared_forward_does_no_more_device_work_than_stock(family):
    stock, census_batch = tiny_model_and_batch(family)
    patched = syncfree.patch(copy.deepcopy(stock))
    batches = {"two images": census_batch, "one block": _one_block_image(stock.config)}
    for layout, batch in batches.items():
        if batch is None:
            continue
        stock_ops, patched_ops = _ops(stock, batch), _ops(patched, syncfree.prepare(batch, "cpu", patched))
        assert patched_ops <= stock_ops, (layout, stock_ops, patched_ops)
    stock_launches = _launches(stock, census_batch, prepared=False)
    patched_launches = _launches(patched, census_batch, prepared=True)
    assert patched_launches <= stock_launches, (stock_launches, patched_launches)
