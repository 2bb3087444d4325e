"""A copy of a supported family under other names (a fork, a ``trust_remote_code`` file), and families registered
from outside: ``patch(model, like=...)`` and ``register_family``."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import pytest
import torch

import syncfree
from syncfree.families import FAMILIES
from syncfree.plan import spec
from syncfree.plan.registry import REGISTRY

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
fork_example = importlib.import_module("patch_a_fork")
sys.path.pop(0)


def _tables() -> tuple:
    return dict(REGISTRY.families), dict(REGISTRY.layouts), dict(REGISTRY.inputs)


@pytest.fixture
def registry():
    """The family table, the layouts and the declared inputs as they were, after the test."""
    before = _tables()
    yield
    for table, kept in zip((REGISTRY.families, REGISTRY.layouts, REGISTRY.inputs), before):
        table.clear()
        table.update(kept)
    for name in [n for n in sys.modules if n == "my_vl" or n.startswith("my_vl.")]:
        del sys.modules[name]


def test_a_renamed_copy_patched_like_its_family_is_sync_free_and_equal(registry):
    result = fork_example.main()
    assert result["patched"] and result["same_logits"]
    assert result["prepared_syncs"] == 0


def test_a_copy_whose_code_differs_is_refused_with_the_nearest_code(registry, tmp_path, monkeypatch):
    monkeypatch.setattr(fork_example, "RENAMES", fork_example.RENAMES + (("lengths", "segment_lengths"),))
    modeling = fork_example.make_fork(str(tmp_path))
    model = fork_example.tiny_fork_model(modeling)
    try:
        with pytest.raises(syncfree.UnsupportedTransformers, match=r"nearest installed code: .*segment_lengths"):
            syncfree.patch(model, like="qwen2_5_vl")
        assert not syncfree.is_patched(model)
    finally:
        sys.path.remove(str(tmp_path))


def test_like_needs_a_supported_family_and_a_model():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not a fully supported family"):
        syncfree.patch(model, like="no_such_family")
    with pytest.raises(ValueError, match="pass the model"):
        syncfree.patch(like="qwen2_5_vl")


def test_register_family_refuses_a_taken_model_type_and_a_non_family(registry):
    family = FAMILIES["qwen2_vl"]
    taken = syncfree.Family("qwen2_vl", family.targets[:1], family.layout)
    with pytest.raises(ValueError, match="already a family"):
        syncfree.register_family(taken)
    with pytest.raises(TypeError, match="takes a syncfree.Family"):
        syncfree.register_family("qwen2_vl")
    mine = syncfree.register_family(syncfree.Family("my_qwen2_vl", family.targets, family.layout))
    assert FAMILIES["my_qwen2_vl"] is mine and spec.layout_of("my_qwen2_vl") is family.layout
    # (the declared object's trait types are public: a family of one's own is made of them)
    traits = {f.name: type(f.default).__name__ for f in dataclasses.fields(syncfree.Layout)
              if dataclasses.is_dataclass(f.default)}
    assert set(traits.values()) == {"TowerShape", "VideoLayout", "RotaryIndex", "AudioLayout", "PlanHooks"}
    assert {"Family", "Target", "Edit", "Layout", "PositionTable", *traits.values()} <= set(syncfree.__all__)
    assert isinstance(family.layout, syncfree.Layout) and isinstance(family.layout.plan, syncfree.PlanHooks)
    assert all(isinstance(getattr(family.layout, name), getattr(syncfree, kind)) for name, kind in traits.items())
    assert isinstance(FAMILIES["qwen3_vl"].layout.table, syncfree.PositionTable)
    assert all(isinstance(e, syncfree.Edit) for t in family.targets for e in t.edits)


def _stock_plus_one(x):
    return x + 1


def test_a_family_s_own_helpers_reach_its_rewritten_code_and_never_shadow_a_shared_one():
    """``Family.helpers``: what its edits call under ``_syncfree`` besides ``rewrite.helpers``, built apart from the
    same edits against the shared helpers; a name the shared helpers have is refused when the family is made."""
    from syncfree import patching
    from syncfree.rewrite import helpers
    from syncfree.rewrite.rewriter import Edit

    layout = FAMILIES["qwen2_vl"].layout
    with pytest.raises(ValueError, match=r"\['all_ones'\] would shadow the shared helpers"):
        syncfree.Family("mine", (), layout, helpers={"all_ones": lambda mask: True})
    with pytest.raises(ValueError, match="not public names"):
        syncfree.Family("mine", (), layout, helpers={"_private": abs})
    mine = syncfree.Family("mine", (), layout, helpers={"plus_one_on_host": lambda x: x + 100})
    target = syncfree.Target("_stock_plus_one", "", edits=(Edit("expr", "x + 1", "_syncfree.plus_one_on_host(x)"),))
    built = patching._build("mine", "_stock_plus_one", target, _stock_plus_one, mine.namespace)
    assert built(1) == 101 and mine.namespace.all_ones is helpers.all_ones
    assert patching._build("mine", "_stock_plus_one", target, _stock_plus_one, mine.namespace) is built
    with pytest.raises(AttributeError, match="plus_one_on_host"):  # (the shared helpers alone do not have it)
        patching._build("mine", "_stock_plus_one", target, _stock_plus_one)(1)


def test_a_copy_patched_like_a_family_is_registered_while_patched_and_the_tables_are_back_after_unpatch(registry,
                                                                                                       tmp_path):
    before = _tables()
    modeling = fork_example.make_fork(str(tmp_path))
    try:
        first, second = fork_example.tiny_fork_model(modeling), fork_example.tiny_fork_model(modeling)
        syncfree.patch(first, like="qwen2_5_vl")
        syncfree.patch(second, like="qwen2_5_vl")
        key = first.config.model_type
        assert key in FAMILIES and spec.layout_of(key) is not None
        syncfree.unpatch(first)  # (the second still holds it)
        assert key in FAMILIES
        syncfree.unpatch(second)
        assert _tables() == before
    finally:
        sys.path.remove(str(tmp_path))


def test_a_refused_patch_like_a_family_leaves_the_tables_as_they_were(registry, tmp_path):
    before = _tables()
    modeling = fork_example.make_fork(str(tmp_path))
    try:
        model = fork_example.tiny_fork_model(modeling)
        with pytest.raises(ValueError, match="vision_every_step"):
            syncfree.patch(model.model.language_model, like="qwen2_5_vl", vision_every_step=True)
        assert _tables() == before and not syncfree.is_patched(model)
    finally:
        sys.path.remove(str(tmp_path))


def test_a_scoped_registration_takes_its_declared_inputs_with_it():
    """``Registry.scoped``: the last release puts back the family, its layouts and the inputs its layout declared."""
    import dataclasses

    from syncfree.plan.hooks import SHARED_INPUTS, PlanHooks
    from syncfree.plan.registry import Registry

    table = Registry()
    layout = dataclasses.replace(FAMILIES["qwen2_vl"].layout, plan=PlanHooks(inputs=("my_input",)))

    def register() -> None:
        table.families["mine"] = "a family"
        table.add_layout("mine", layout, SHARED_INPUTS)

    first, second = table.scoped("mine", ("mine",), register), table.scoped("mine", ("mine",), register)
    assert list(table.inputs) == ["my_input"] and table.layouts == {"mine": layout}
    first()
    first()  # (a release is done once)
    assert "mine" in table.families and "my_input" in table.inputs
    second()
    assert (table.families, table.layouts, table.inputs) == ({}, {}, {})
