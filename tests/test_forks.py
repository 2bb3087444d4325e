"""A copy of a supported family under other names (a fork, a ``trust_remote_code`` file), and families registered
from outside: ``patch(model, like=...)`` and ``register_family``."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

import syncfree
from syncfree.families import FAMILIES
from syncfree.plan import spec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
fork_example = importlib.import_module("patch_a_fork")
sys.path.pop(0)


@pytest.fixture
def registry():
    """The family table and the layouts as they were, after the test."""
    families, layouts = dict(FAMILIES), dict(spec._LAYOUTS)
    yield
    FAMILIES.clear()
    FAMILIES.update(families)
    spec._LAYOUTS.clear()
    spec._LAYOUTS.update(layouts)
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
