"""The auditor on stock Transformers Qwen3-VL: it finds the known syncs, by source line, and changes no number.

The source lines are looked up in the installed ``modeling_qwen3_vl.py`` by what
they say, so these tests hold the installed Transformers version to the facts in
DESIGN.md section 2 rather than to line numbers copied from one release.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from syncfree.audit import audit, emulate_cuda
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import build_model


@pytest.fixture(scope="module")
def modeling():
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    return modeling_qwen3_vl


def _lines(func) -> range:
    source, start = inspect.getsourcelines(func)
    return range(start, start + len(source))


def _line_of(func, needle: str) -> int:
    source, start = inspect.getsourcelines(func)
    hits = [start + i for i, text in enumerate(source) if needle in text]
    assert len(hits) == 1, f"{needle!r} found {len(hits)} times in {func.__qualname__}"
    return hits[0]


def _audit_forward(model, batch):
    with emulate_cuda(), torch.no_grad():
        model.to("cuda")
        device_batch = {k: v.to("cuda") for k, v in batch.items()}
        with audit() as report:
            out = model(**device_batch)
        logits = out.logits.cpu()
        model.to("cpu")
    return report, logits


@pytest.fixture(scope="module")
def mixed_audit():
    model = build_model("qwen3-vl-tiny", attn="sdpa")
    batch = build_inputs(model.config, named_layout("mixed", 64))
    report, _ = _audit_forward(model, batch)
    return model.config, report


def _at(report, path: str, lines) -> list:
    return [e for e in report.syncs if e.where and e.where.filename == path and e.where.lineno in lines]


def test_vision_attention_splits_three_times_per_block_per_vision_call(modeling, mixed_audit):
    config, report = mixed_audit
    line = _line_of(modeling.Qwen3VLVisionAttention.forward, "lengths.tolist()")
    split = _at(report, modeling.__file__, [line])
    # q, k and v are each split with a fresh .tolist(); the mixed batch runs the tower for images and for videos.
    assert len(split) == 3 * config.vision_config.depth * 2
    assert {e.api for e in split} == {"Tensor.tolist"}


def test_rope_index_syncs_are_found_inside_get_rope_index(modeling, mixed_audit):
    _, report = mixed_audit
    body = _lines(modeling.Qwen3VLModel.get_rope_index)
    found = _at(report, modeling.__file__, body)
    lines = {e.where.lineno for e in found}
    assert _line_of(modeling.Qwen3VLModel.get_rope_index, "input_token_type.tolist()") in lines
    assert _line_of(modeling.Qwen3VLModel.get_rope_index, "torch.tensor(mrope_position_deltas") in lines
    assert {"aten::index.Tensor", "aten::index_put_", "Tensor.tolist"} <= {e.op for e in found}
    # The per-grid .item() reads happen in the helper it calls, with get_rope_index on the call chain.
    helper = _at(report, modeling.__file__, _lines(modeling.Qwen3VLModel.get_vision_position_ids))
    assert helper and all("get_rope_index" in [f.function for f in e.stack] for e in helper)


def test_placeholder_checks_sync_for_each_modality(modeling, mixed_audit):
    _, report = mixed_audit
    checks = [e for e in report.syncs if "get_placeholder_mask" in [f.function for f in e.stack]]
    image_line = _line_of(modeling.Qwen3VLModel.get_placeholder_mask, "Image features and image tokens")
    video_line = _line_of(modeling.Qwen3VLModel.get_placeholder_mask, "Video features and video tokens")
    assert {image_line, video_line} <= {e.where.lineno for e in checks}
    assert len(checks) == 4  # per modality: the f-string of a device count, and the value check


def test_deepstack_merge_syncs_per_level(modeling, mixed_audit):
    config, report = mixed_audit
    levels = len(config.vision_config.deepstack_visual_indexes)
    joint = _at(report, modeling.__file__, _lines(modeling.Qwen3VLModel.forward))
    # image+video: two mask reads, then per level a count, and two masked writes.
    assert len(joint) == 2 + 3 * levels
    process = _at(report, modeling.__file__, _lines(modeling.Qwen3VLTextModel._deepstack_process))
    assert len(process) == 2 * levels
    assert {e.op for e in process} == {"aten::index.Tensor", "aten::index_put_"}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["image", "images", "video", "mixed"])
def test_emulated_logits_equal_plain_cpu_logits(attn, kind):
    model = build_model("qwen3-vl-tiny", attn=attn)
    batch = build_inputs(model.config, named_layout(kind, 64))
    with torch.no_grad():
        expected = model(**batch).logits
    report, logits = _audit_forward(model, batch)
    assert torch.equal(logits, expected)
    assert len(report.syncs) > 0
