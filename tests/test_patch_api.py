"""patch/unpatch mechanics, refusal on unknown Transformers code, clear errors for bad input, compile."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch

import syncfree
from family_checks import traced_copy
from syncfree.inputs import Image, Text, Video, build_inputs, named_layout
from syncfree.presets import build_model


@pytest.fixture(scope="module")
def patched():
    return syncfree.patch(build_model("qwen3-vl-tiny"))


@pytest.fixture
def modeling():
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    return modeling_qwen3_vl


def test_class_patching_covers_models_built_afterwards_and_unpatch_restores_exactly(modeling):
    originals = {name: modeling.Qwen3VLModel.__dict__[name] for name in ("forward", "get_rope_index")}
    attention = modeling.Qwen3VLVisionAttention.__dict__["forward"]
    syncfree.patch()
    try:
        model = build_model("qwen3-vl-tiny")
        assert syncfree.is_patched(model)
        assert modeling.Qwen3VLModel.__dict__["forward"] is not originals["forward"]
        syncfree.patch()  # patching twice keeps the real originals
    finally:
        syncfree.unpatch()
    assert {name: modeling.Qwen3VLModel.__dict__[name] for name in originals} == originals
    assert modeling.Qwen3VLVisionAttention.__dict__["forward"] is attention
    assert not syncfree.is_patched(model)


def test_instance_patch_leaves_the_class_alone(patched, modeling):
    other = build_model("qwen3-vl-tiny")
    assert syncfree.is_patched(patched) and not syncfree.is_patched(other)
    assert "forward" in patched.model.__dict__ and "forward" not in other.model.__dict__


def test_patching_a_vision_tower_alone(modeling):
    from syncfree.presets import build_vision_model

    visual = syncfree.patch(build_vision_model("qwen3-vl-tiny"))
    assert "forward" in visual.__dict__ and "forward" in visual.blocks[0].attn.__dict__


def test_unknown_transformers_code_is_refused_and_nothing_is_patched(monkeypatch, modeling):
    def forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
        return hidden_states  # a "new release" whose attention no longer splits with lengths.tolist()

    monkeypatch.setattr(modeling.Qwen3VLVisionAttention, "forward", forward)
    model = build_model("qwen3-vl-tiny")
    import transformers

    with pytest.raises(syncfree.UnsupportedTransformers,
                       match=rf"Transformers {transformers.__version__}, Qwen3VLVisionAttention.forward is not the "
                             r"function .*\(the code 'splits = \[torch.split\(tensor, lengths.tolist\(\), dim=2\).*' "
                             r"appears 0 times, not 1; .*\)\. Nothing was patched"):
        syncfree.patch(model)
    assert not syncfree.is_patched(model)


def test_models_of_other_families_are_refused_with_the_types_found():
    with pytest.raises(ValueError, match="no supported model.*supported: qwen3_vl"):
        syncfree.patch(torch.nn.Linear(2, 2))


@pytest.fixture(scope="module")
def stock():
    return build_model("qwen3-vl-tiny")


def _expect(stock, patched, batch, match):
    """prepare() explains the problem; the patched forward fails exactly as stock does (type and message)."""
    with pytest.raises(ValueError, match=match):
        syncfree.prepare(batch, None, patched)
    with pytest.raises(Exception) as expected, torch.no_grad():
        stock(**batch)
    with pytest.raises(type(expected.value)) as got, torch.no_grad():
        patched(**batch)
    assert str(got.value) == str(expected.value)


def test_grid_and_token_count_mismatch(stock, patched):
    batch = build_inputs(patched.config, [[Text(3), Image(64, 64), Text(2)]])
    batch["image_grid_thw"] = torch.tensor([[1, 8, 8]])
    batch["pixel_values"] = torch.randn(64, batch["pixel_values"].shape[1])
    _expect(stock, patched, batch, r"Image features and image tokens do not match, tokens: 4, features: 16")


@pytest.mark.parametrize("grid, match", [
    (torch.tensor([1, 4, 4]), r"image_grid_thw must have shape \(N, 3\)"),
    (torch.tensor([[1, 4]]), r"image_grid_thw must have shape \(N, 3\)"),
    (torch.tensor([[1.0, 4.0, 4.0]]), "image_grid_thw must hold integers"),
    (torch.tensor([[1, 3, 4]]), "multiples of spatial_merge_size=2"),
])
def test_wrong_grid_shape_or_dtype(patched, grid, match):
    batch = build_inputs(patched.config, [[Text(3), Image(64, 64), Text(2)]])
    batch["image_grid_thw"] = grid
    with pytest.raises(ValueError, match=match):
        syncfree.prepare(batch, None, patched)


@pytest.mark.parametrize("frames", [2, 4])
def test_video_frame_runs_must_match_video_grid(stock, patched, frames):
    batch = build_inputs(patched.config, [[Text(3), Video(6, 32, 32), Text(2)]])  # three frame runs
    batch["video_grid_thw"] = torch.tensor([[frames, 2, 2]])
    batch["pixel_values_videos"] = batch["pixel_values_videos"][: frames * 4]
    _expect(stock, patched, batch, rf"Video features and video tokens do not match, tokens: 3, features: {frames}")


def test_placeholder_runs_that_do_not_match_the_grids_are_named_by_prepare(patched):
    # The totals agree (4 + 1 tokens either way), the runs do not: stock would build wrong 3D positions.
    batch = build_inputs(patched.config, [[Text(3), Image(64, 64), Text(2), Image(32, 32), Text(2)]])
    batch["image_grid_thw"] = batch["image_grid_thw"].flip(0)
    with pytest.raises(ValueError, match=r"image placeholder runs in the tokens have \[4, 1\] tokens but "
                                         r"image_grid_thw needs one run per image of \[1, 4\]"):
        syncfree.prepare(batch, None, patched)


def test_features_for_an_image_without_placeholder(stock, patched):
    batch = build_inputs(patched.config, [[Text(3), Image(64, 64), Text(2)]])
    extra = build_inputs(patched.config, [[Image(32, 32)]])
    batch["image_grid_thw"] = torch.cat([batch["image_grid_thw"], extra["image_grid_thw"]])
    batch["pixel_values"] = torch.cat([batch["pixel_values"], extra["pixel_values"]])
    _expect(stock, patched, batch, "Image features and image tokens do not match, tokens: 4, features: 5")


def test_pixel_rows_must_match_the_grid(stock, patched):
    batch = build_inputs(patched.config, [[Text(3), Image(64, 64), Text(2)]])
    batch["pixel_values"] = batch["pixel_values"][:-1]
    _expect(stock, patched, batch, "pixel_values has 15 patches but image_grid_thw describes 16")


def test_prepare_refuses_device_tensors_and_is_idempotent(patched):
    batch = build_inputs(patched.config, named_layout("image", 64))
    host = syncfree.prepare(batch, None, patched)
    again = syncfree.prepare(host, None, patched)
    assert again["syncfree_plan"] is host["syncfree_plan"]
    from syncfree.audit import emulate_cuda

    with emulate_cuda():
        moved = {k: v.to("cuda") for k, v in batch.items()}
        with pytest.raises(ValueError, match="expects the processor's CPU tensors, but input_ids is on cuda:0"):
            syncfree.prepare(moved, "cuda", patched)


def test_prepared_batch_pickles_for_dataloader_workers(patched):
    batch = build_inputs(patched.config, named_layout("mixed", 64))
    host = syncfree.prepare(batch, None, patched)
    restored = pickle.loads(pickle.dumps(host))
    with torch.no_grad():
        assert torch.equal(patched(**restored).logits, patched(**host).logits)


def test_plan_built_for_other_config_values_is_refused(patched):
    import dataclasses

    from syncfree.plan.spec import ModelSpec

    batch = build_inputs(patched.config, named_layout("image", 64))
    other = dataclasses.replace(ModelSpec.from_config(patched.config), num_grid_per_side=48)
    default_plan = syncfree.prepare(batch, None, other)
    with pytest.raises(ValueError, match="pass the model \\(or its config\\) to syncfree.prepare"), torch.no_grad():
        patched(**default_plan)


def test_patched_vision_tower_compiles_without_graph_breaks(patched):
    batch = build_inputs(patched.config, named_layout("images", 64))
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    args = (batch["pixel_values"],)
    kwargs = {"grid_thw": batch["image_grid_thw"], "syncfree_vision_plan": plan}
    explained = torch._dynamo.explain(traced_copy(patched.model.visual))(*args, **kwargs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    stock_explained = torch._dynamo.explain(traced_copy(build_model("qwen3-vl-tiny").model.visual))(
        *args, grid_thw=batch["image_grid_thw"])
    assert stock_explained.graph_break_count > 0
    compiled = torch.compile(traced_copy(patched.model.visual), fullgraph=True, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(*args, **kwargs).pooler_output, patched.model.visual(*args, **kwargs).pooler_output)


def test_prepare_without_a_model_reads_the_placeholder_ids_from_the_token_types(patched):
    batch = build_inputs(patched.config, named_layout("mixed", 64))  # the tiny preset's ids: 1000 and 1001
    plan = syncfree.prepare(batch)["syncfree_plan"]
    assert (plan.spec.image_token_id, plan.spec.video_token_id) == (1000, 1001)
    assert plan.n_image_tokens == int((batch["mm_token_type_ids"] == 1).sum())


# First thing in a process (a spawned DataLoader worker): nothing has imported the family registry yet.
_FRESH_PREPARE = """
import sys, torch, syncfree
assert "syncfree.families" not in sys.modules
ids = torch.tensor([[1, 2, 151655, 151655, 151655, 151655, 3]])
types = (ids == 151655).long()
batch = dict(input_ids=ids, mm_token_type_ids=types, attention_mask=torch.ones_like(ids),
             image_grid_thw=torch.tensor([[1, 4, 4]]), pixel_values=torch.zeros(16, 3 * 2 * 16 * 16))
spec = syncfree.prepare(batch)["syncfree_plan"].spec
from syncfree.families import FAMILIES
print(spec.model_type, spec.spatial_merge_size, spec.num_grid_per_side, spec.image_token_id, spec.video_token_id,
      spec.vision_module == FAMILIES[spec.model_type].layout.modeling)
"""


def test_prepare_without_a_model_assumes_the_published_values_a_family_declares_even_first_in_a_process():
    """The values ``prepare(batch)`` assumes without a model are one family group's (``ASSUMED_SPEC``), registered
    with the plan by the registry, which ``prepare`` imports for them."""
    run = subprocess.run([sys.executable, "-c", _FRESH_PREPARE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["qwen3_vl", "2", "48", "151655", "151656", "True"]


def test_prepare_without_a_model_or_token_types_says_to_pass_the_model(patched):
    batch = build_inputs(patched.config, named_layout("image", 64))
    batch["mm_token_type_ids"] = batch["mm_token_type_ids"].clone()
    batch["mm_token_type_ids"][0, 0] = 1  # disagrees with input_ids whatever the ids are
    with pytest.raises(ValueError, match=r"pass the model or its config as syncfree.prepare\(batch, device, model\)"):
        syncfree.prepare(batch)


def test_class_unpatch_also_removes_the_chosen_attention_backend(modeling):
    syncfree.patch(families=("qwen3_vl",), vision_attention="grouped")
    try:
        assert modeling.Qwen3VLVisionModel.__dict__["_syncfree_attention"] == "grouped"
    finally:
        syncfree.unpatch()
    assert "_syncfree_attention" not in modeling.Qwen3VLVisionModel.__dict__
    assert not syncfree.is_patched(build_model("qwen3-vl-tiny"))


def test_the_class_patch_table_keeps_the_name_the_transformers_test_harness_reads():
    """``../shared/hf-tests``' plugin checks a class-level patch stayed applied through ``patching._class_patches``:
    the registry's own table under that name (a copy would stay empty)."""
    import syncfree.patching as patching
    from syncfree.plan.registry import REGISTRY

    assert patching._class_patches is REGISTRY.class_patches
