"""What patch(verbose=True) and describe_patch say: every function syncfree replaced in the model, the stock lines
rewritten in it and its wrapper, read back from the patched model (checked against the family tables)."""

from __future__ import annotations

import importlib.util

import pytest

import syncfree
from family_checks import registration_lifted
from syncfree.families import FAMILIES, MODULE_TARGETS
from syncfree.patch_registry import target_class
from syncfree.patch_report import describe_patch
from syncfree.presets import build_model

# A family given the generic fix only: MiniCPM-V 4.7 with its registration lifted (every family with the split whose tiny
# model builds is fully supported now; Transformers 5.17 has no MiniCPM-V 4.7: tests needing it skip).
GENERIC = "minicpmv4_7"
needs_generic = pytest.mark.skipif(importlib.util.find_spec(f"transformers.models.{GENERIC}") is None,
                                   reason=f"this Transformers release has no {GENERIC}")


def _normalized_source(fn) -> str:
    import ast
    import inspect
    import textwrap

    fn = inspect.unwrap(fn)
    return ast.unparse(ast.parse(textwrap.dedent(inspect.getsource(fn))))


@pytest.mark.parametrize("name", ["ernie4.5-vl-tiny", "glm4.1v-tiny", "qwen2.5-vl-tiny"])
def test_a_fully_supported_model_lists_each_target_with_its_edits_and_wrapper(name):
    model = syncfree.patch(build_model(name))
    said = describe_patch(model)
    family = FAMILIES[model.config.model_type]
    assert (said.support, said.family) == ("full", family.model_type)
    listed = {f.where: f for f in said.functions}
    for target in family.targets:
        cls = target_class(family, target)
        if target.check_only or cls is None or not any(isinstance(m, cls) for m in model.modules()):
            continue
        where = f"{cls.__name__}.{target.attr}"
        if where not in listed:  # an optional target absent from this release
            assert target.optional, where
            continue
        got = listed[where]
        wrapper = target.wrap.__name__ if target.wrap is not None else None
        # (an edit that applies only where its code is there, count=None, is listed where the stock function has it)
        stock = _normalized_source(getattr(cls, target.attr))
        applied = [e for e in target.edits if e.kind != "prepend" and (e.count is not None or e.normalized_old() in stock)]
        assert got.wrapper == wrapper and len(got.rewrote) == len(applied)
        assert got.modules == sum(isinstance(m, cls) for m in model.modules())
    assert {f.where.rsplit(".", 1)[0] for f in said.shared} <= {f"{m}.{n}".rsplit(".", 1)[0]
                                                               for m, n in MODULE_TARGETS}
    text = "\n".join(said.lines())
    assert all(f.where in text for f in said.functions)
    assert all(f.does and f.does in text for f in said.functions if f.wrapper)


def test_verbose_prints_the_description(capsys):
    model = syncfree.patch(build_model("ernie4.5-vl-tiny"), verbose=True)
    assert capsys.readouterr().out.splitlines() == describe_patch(model).lines()


def test_an_unpatched_model_is_said_to_be_unpatched():
    said = describe_patch(build_model("qwen3-vl-tiny"))
    assert said.support == "none" and not said.functions and "is not patched" in said.lines()[0]


@needs_generic
def test_the_generic_fix_says_what_it_left_as_stock():
    from syncfree.census.tiny import build_tiny

    with registration_lifted(GENERIC):
        said = describe_patch(syncfree.patch(build_tiny(GENERIC)))
    assert said.support == "generic" and [f.where for f in said.functions] == ["MiniCPMV4_7VisionAttention.forward"]
    assert said.functions[0].rewrote and said.functions[0].wrapper is None
    assert not said.shared and any("left as stock" in line for line in said.lines())


@needs_generic
def test_the_report_command_lists_what_a_generic_fix_leaves(capsys):
    from syncfree.cli.main import main

    with registration_lifted(GENERIC):
        assert main(["patch", "--report", "--model", GENERIC]) == 0
    out = capsys.readouterr().out
    assert "generic fix" in out and "MiniCPMV4_7VisionAttention.forward" in out and "left (patched):" in out
    counts = out.split("syncs in one forward on the emulated device: ")[1].splitlines()[0]
    stock, patched = (int(part.split()[1]) for part in counts.split(";")[0].split(" -> "))
    assert stock > patched > 0 and "outputs equal to stock" in counts


def test_the_report_command_finds_nothing_left_in_a_fully_supported_bf16_moe(capsys):
    from syncfree.cli.main import main

    assert main(["patch", "--report", "--model", "ernie4.5-vl-tiny", "--inputs", "mixed", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "ernie4_5_vl_moe, full support" in out and "patched+prepare 0 (0 blocking copies)" in out
    assert out.rstrip().endswith("left (patched+prepare):\n(nothing)")
    assert "syncfree patch --report --model MODEL" not in out  # (it does not send the user to the command they ran)


@pytest.mark.parametrize("argv, words", [(["patch", "--model", "kimi_k25"], "add --report"),
                                         (["patch", "--report", "--model", "llama"], "not a preset, a checkpoint")])
def test_the_report_command_refuses_clearly(argv, words, capsys):
    from syncfree.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
