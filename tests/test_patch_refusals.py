"""patch() is all or nothing: a refused patch leaves the model, the classes and Transformers' modules as it found
them; a model that only borrows a supported family's sub-model is not taken for that family."""

from __future__ import annotations

import sys

import pytest
import torch

import syncfree
from syncfree.census import discover
from syncfree.census.tiny import build_tiny

# A family with its own vision tower (with the packed split) under Qwen3.5's text model, and no full support of its
# own: MiniCPM-V 4.7 (Transformers 5.24), or 4.6 where it is not registered (5.17, whose 4.6 code syncfree leaves stock).
BORROWER = "minicpmv4_7" if "minicpmv4_7" in discover() else "minicpmv4_6"


def _snapshot(model: torch.nn.Module) -> dict:
    """Every attribute of every loaded Transformers module and of every class they define, by identity, and
    what each module of ``model`` holds in its own ``__dict__``."""
    seen = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            seen[(name, attr)] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for cls_attr, cls_value in list(vars(value).items()):
                    seen[(name, attr, cls_attr)] = id(cls_value)
    for i, module in enumerate(model.modules()):
        seen[("model", i)] = tuple(sorted((k, id(v)) for k, v in module.__dict__.items()))
    return seen


@pytest.fixture(scope="module")
def borrower():
    if BORROWER not in discover():
        pytest.skip(f"this Transformers release has no {BORROWER}")
    return build_tiny(BORROWER)


@pytest.fixture(scope="module")
def qwen35_text_model():
    return build_tiny("qwen3_5").model.language_model  # a Qwen3.5 text model alone: no class syncfree patches


def test_a_model_borrowing_a_families_text_model_gets_the_generic_fix(borrower, capsys):
    syncfree.unpatch()
    try:
        patched = syncfree.patch(borrower, verbose=True)
        said = capsys.readouterr().out
        assert syncfree.is_patched(patched)
        assert "generic fix" in said and "VisionAttention.forward" in said
        assert not any("Qwen3_5" in type(m).__name__ for m in patched.modules()
                       if any(getattr(v, "__func__", None) is not None for v in m.__dict__.values()))
    finally:
        syncfree.unpatch(borrower)


@pytest.mark.parametrize("case", ["text model of a family", "vision_every_step on the generic fix",
                                  "vision_attention on the generic fix"])
def test_a_refused_patch_leaves_the_process_as_it_found_it(case, borrower, qwen35_text_model):
    syncfree.unpatch()  # (restores the module-level functions an earlier instance patch installed)
    model, kwargs, match = {
        "text model of a family": (qwen35_text_model, {}, "no supported model"),
        "vision_every_step on the generic fix": (borrower, {"vision_every_step": True}, "vision_every_step"),
        "vision_attention on the generic fix": (borrower, {"vision_attention": "grouped"}, "vision_attention"),
    }[case]
    before = _snapshot(model)
    with pytest.raises(ValueError, match=match):
        syncfree.patch(model, **kwargs)
    after = _snapshot(model)
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == set()
    assert not syncfree.is_patched(model)


def test_a_patch_that_would_change_nothing_says_so_and_patches_nothing():
    if "inkling2" not in discover():
        pytest.skip("this Transformers release has no inkling2")
    model = build_tiny("inkling2")  # its tower makes cu_seqlens from image_grid_thw.cpu(): the split reads the host
    with pytest.warns(UserWarning, match="patched nothing: Inkling2VisionModel makes its attention's cu_seqlens"):
        assert syncfree.patch(model) is model
    assert not syncfree.is_patched(model)


@pytest.mark.parametrize("preset", sorted(p for p in __import__("syncfree.presets", fromlist=["PRESETS"]).PRESETS
                                          if p.endswith("-tiny")))
def test_every_tiny_presets_tower_builds_alone_and_patches_alone(preset):
    """``build_vision_model`` gives the full model's tower class (GLM-4.6V's is GLM-4.1V's), and patch() takes it."""
    from syncfree.families import FAMILIES, VISION_CLASSES
    from syncfree.patch_registry import installed
    from syncfree.presets import PRESETS, build_model, build_vision_model, vision_tower_of

    if not installed(FAMILIES[PRESETS[preset].values["model_type"]].modeling):
        pytest.skip(f"this Transformers release has no {PRESETS[preset].values['model_type']}")
    if PRESETS[preset].values["model_type"] not in VISION_CLASSES:
        pytest.skip(f"{preset} has no vision tower (an audio-only model)")
    tower = build_vision_model(preset)
    # (An Omni thinker in Transformers 5.17 holds its tower itself; ERNIE-4.5-VL's is its vision_tower.)
    assert type(tower) is type(vision_tower_of(build_model(preset)))
    assert syncfree.is_patched(syncfree.patch(tower))
