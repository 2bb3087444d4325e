"""A patched training step: 0 syncs with prepare() in every phase, and the same gradients as stock."""

from __future__ import annotations

import pytest
import torch

import syncfree
from family_checks import checkpointing
from syncfree.audit import emulate_cuda
from syncfree.compare.forward import AuditSpec
from syncfree.compare.train import labels_for, run_train_compare, train_step
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.presets import PRESETS, build_model, load_config

# MoE experts in bfloat16: CUDA's grouped matmul fast path (fp32 takes a fallback that syncs, see rules.py).
FAMILIES = {"qwen2-vl-tiny": torch.float32, "qwen2.5-vl-tiny": torch.float32, "qwen3-vl-tiny": torch.float32,
            "qwen3-vl-moe-tiny": torch.bfloat16, "qwen3.5-tiny": torch.float32}


# (Qwen3.5's linear-attention reference kernels and the MoE experts make the slowest steps: the slow step runs them.)
@pytest.mark.parametrize("preset", [pytest.param(p, marks=[pytest.mark.slow] * (p in ("qwen3.5-tiny", "qwen3-vl-moe-tiny")))
                                    for p in sorted(FAMILIES)])
def test_patched_step_with_prepare_has_no_sync_in_any_phase(preset):
    reports, about = run_train_compare(AuditSpec(model=preset, inputs="mixed", dtype=FAMILIES[preset]),
                                       grad_ckpt="non-reentrant")
    prepared = reports["patched+prepare"]
    assert prepared.syncs == [] and prepared.blocking_copies == []
    assert reports["patched"].summary()["syncs"] == 1  # the one explicit read without prepare()
    assert reports["stock"].by_phase()["backward"]["syncs"] > 0  # stock's backward does sync
    assert len(set(about["losses"].values())) == 1  # the three steps computed the same loss


@pytest.mark.parametrize("preset, dtype", [("qwen2.5-omni-tiny", torch.float32), ("qwen3-omni-tiny", torch.bfloat16)])
def test_omni_thinker_step_with_a_videos_audio_track_has_no_sync_in_any_phase(preset, dtype):
    # The batch carries the forward's use_audio_in_video flag (a bool beside the tensors).
    reports, about = run_train_compare(AuditSpec(model=preset, inputs="audio-in-video", dtype=dtype),
                                       grad_ckpt="reentrant")
    assert reports["patched+prepare"].syncs == [] and reports["patched+prepare"].blocking_copies == []
    assert reports["patched"].summary()["syncs"] == 1
    assert reports["stock"].by_phase()["recompute"]["syncs"] > 0
    assert len(set(about["losses"].values())) == 1


def test_assert_no_sync_holds_for_a_reentrant_checkpointed_step():
    preset = "qwen3-vl-tiny"
    config = load_config(preset)
    batch = build_inputs(config, [[Text(5), Image(64, 64), Text(4)], [Video(4, 64, 64), Text(3)]],
                         pad_token_id=PRESETS[preset].pad_token_id)
    labels = labels_for(batch)
    model = build_model(preset, attn="sdpa", dtype=torch.float32, seed=0).train()
    checkpointing(model, {"use_reentrant": True})
    with emulate_cuda():
        model.to("cuda")
        syncfree.patch(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        device_batch = syncfree.prepare(batch, "cuda", model)
        device_batch["labels"] = labels.to("cuda", non_blocking=True)
        with syncfree.assert_no_sync():
            train_step(model, device_batch, optimizer)


# Two requests per micro-batch; u is the model's image unit (patch x merge size, in pixels).
LAYOUTS = {
    "image": lambda u: [[Text(4), Image(2 * u, 2 * u), Text(3)], [Text(2), Image(2 * u, u), Text(5)]],
    "video": lambda u: [[Text(3), Video(4, 2 * u, 2 * u), Text(2)], [Text(6)]],
    "mixed": lambda u: [[Text(2), Image(2 * u, 2 * u), Text(2), Video(2, u, 2 * u), Text(1)], [Image(u, u), Text(7)]],
    "text-only": lambda u: [[Text(9)], [Text(5)]],
}


def _grads(preset: str, batch: dict, patched: bool, grad_ckpt: bool):
    model = build_model(preset, attn="sdpa", dtype=torch.float32, seed=0).train()
    if grad_ckpt:
        checkpointing(model, {"use_reentrant": False})
    if patched:
        syncfree.patch(model)
        batch = syncfree.prepare(batch, "cpu", model)
    loss = model(**batch, labels=labels_for(batch)).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


# The whole grid for Qwen2.5-VL and Qwen3-VL; the other families on mixed and text-only micro-batches.
_GRID = [(p, layout, side, ckpt) for p in ("qwen2.5-vl-tiny", "qwen3-vl-tiny") for layout in sorted(LAYOUTS)
         for side in ("left", "right") for ckpt in (False, True)]
_GRID += [(p, layout, "left", ckpt) for p in ("qwen2-vl-tiny", "qwen3-vl-moe-tiny", "qwen3.5-tiny")
          for layout in ("mixed", "text-only") for ckpt in (False, True)]


@pytest.mark.parametrize("preset,layout,padding_side,grad_ckpt", _GRID,
                         ids=[f"{p}-{lay}-{side}-{'ckpt' if c else 'plain'}" for p, lay, side, c in _GRID])
def test_patched_gradients_equal_stock(preset, layout, padding_side, grad_ckpt):
    config = load_config(preset)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    batch = build_inputs(config, LAYOUTS[layout](unit), padding_side=padding_side, pad_token_id=PRESETS[preset].pad_token_id)
    stock_loss, stock = _grads(preset, batch, patched=False, grad_ckpt=grad_ckpt)
    patched_loss, patched = _grads(preset, batch, patched=True, grad_ckpt=grad_ckpt)
    assert torch.equal(stock_loss, patched_loss)
    assert stock.keys() == patched.keys()
    for name in stock:
        assert torch.equal(stock[name], patched[name]), name


@pytest.mark.parametrize("preset", ["qwen2.5-vl-tiny", "qwen3-vl-tiny", "qwen3.5-tiny"])
def test_a_text_only_micro_batch_runs_no_vision_and_reads_at_most_once(preset):
    config = load_config(preset)
    batch = build_inputs(config, LAYOUTS["text-only"](32), pad_token_id=PRESETS[preset].pad_token_id)
    batch["labels"] = labels_for(batch)
    model = build_model(preset, attn="sdpa", dtype=torch.float32, seed=0).train()
    vision_calls = []
    model.model.visual.register_forward_hook(lambda *args: vision_calls.append(1))
    with emulate_cuda():
        model.to("cuda")
        stock = model(**{k: v.to("cuda") for k, v in batch.items()}).loss
        syncfree.patch(model)
        on_device = {k: v.to("cuda") for k, v in batch.items()}
        with syncfree.audit() as plain:
            loss = model(**on_device).loss
            loss.backward()
        prepared = syncfree.prepare(batch, "cuda", model)
        with syncfree.assert_no_sync():
            model(**prepared).loss.backward()
        assert torch.equal(stock.to("cpu"), loss.to("cpu"))
    assert plain.summary()["syncs"] == 1 and plain.blocking_copies == []  # the one explicit read
    assert vision_calls == []


def _one_batch(preset: str = "qwen3-vl-tiny") -> dict:
    config = load_config(preset)
    batch = build_inputs(config, LAYOUTS["mixed"](32), pad_token_id=PRESETS[preset].pad_token_id)
    batch["labels"] = labels_for(batch)
    return batch


@pytest.mark.parametrize("count", ["int", "device tensor", "host tensor"])
def test_the_loss_path_as_trainer_calls_it_reads_nothing_from_the_device(count):
    batch = _one_batch()
    n = int((batch["labels"][:, 1:] != -100).sum())
    model = build_model("qwen3-vl-tiny", dtype=torch.float32, seed=0).train()
    with emulate_cuda():
        model.to("cuda")
        syncfree.patch(model)
        items = {"int": n, "device tensor": torch.tensor(n).to("cuda"), "host tensor": torch.tensor(n)}[count]
        prepared = syncfree.prepare(batch, "cuda", model)
        with syncfree.audit() as report:
            model(**prepared, num_items_in_batch=items).loss.backward()
    assert report.syncs == []
    if count == "host tensor":  # Transformers' loss moves it to the device: a copy (the caller's choice), no wait
        (copy,) = report.copies
        assert copy.kind == "h2d" and copy.line.startswith("transformers/loss/loss_utils.py")
    else:
        assert report.copies == []


def test_labels_of_the_wrong_shape_are_refused_as_stock_refuses_them():
    batch = _one_batch()
    batch["labels"] = batch["labels"][:, :-1]
    errors = []
    for patched in (False, True):
        model = build_model("qwen3-vl-tiny", dtype=torch.float32, seed=0)
        if patched:
            syncfree.patch(model)
        with pytest.raises(ValueError) as caught:
            model(**(syncfree.prepare(batch, "cpu", model) if patched else batch))
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
