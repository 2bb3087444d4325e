"""A Transformers release that changes one family's code leaves that family stock, and only that one.

The change is made in this process: a target's stock function is replaced by one of other source (as a release
would rewrite it). Then the class-level ``patch()`` patches every other family and warns once naming the changed
one, ``patch(strict=True)`` and an instance patch refuse, ``syncfree doctor`` exits 1 naming it, the census gives it
a row that says why, and every refusal shows the installed code nearest to what the edit expects.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
import warnings

import pytest
import torch

import syncfree
from syncfree.families import FAMILIES
from syncfree.patch_registry import installed, target_class
from syncfree.patching import check_family
from syncfree.plan.registry import REGISTRY
from syncfree.rewrite.nearest import nearest_code, nearest_fragment

CHANGED = "qwen2_vl"


@pytest.fixture
def changed_release(tmp_path):
    """Qwen2-VL's vision attention ``forward`` replaced by its own source with a variable renamed, compiled from a
    file of its own (a stand-in for a release that reworded it: same behaviour, other code); restored afterwards,
    every class unpatched."""
    family = FAMILIES[CHANGED]
    target = next(t for t in family.targets if t.edits and not t.optional)
    cls = target_class(family, target)
    stock = cls.__dict__[target.attr]
    plain = inspect.unwrap(stock)
    source = textwrap.dedent(inspect.getsource(plain))
    reworded = source.replace("lengths", "segment_lengths")
    assert reworded != source
    path = tmp_path / f"modeling_{CHANGED}.py"  # (the reworded release's file: what a refusal points at)
    path.write_text(reworded)
    scope: dict = {}
    exec(compile(reworded, str(path), "exec"), plain.__globals__, scope)

    syncfree.unpatch()
    setattr(cls, target.attr, scope[plain.__name__])
    import syncfree.patching as patching

    patching._warned.clear()
    try:
        yield cls, target.attr
    finally:
        syncfree.unpatch()
        setattr(cls, target.attr, stock)
        patching._warned.clear()


def _patched_families() -> set[str]:
    return {name for name, family in FAMILIES.items() if installed(family.modeling)
            and any(cls.__module__ == family.modeling for cls, _ in REGISTRY.class_patches)}


def test_class_patch_patches_every_other_family_and_warns_once(changed_release):
    cls, attr = changed_release
    with pytest.warns(syncfree.FamilyLeftStock, match=rf"left {CHANGED} stock: .*{cls.__name__}\.{attr}") as caught:
        syncfree.patch()
    assert len([w for w in caught if issubclass(w.category, syncfree.FamilyLeftStock)]) == 1
    expected = {n for n, f in FAMILIES.items() if installed(f.modeling)} - {CHANGED}
    patched = _patched_families()
    assert expected <= patched, f"not patched: {sorted(expected - patched)}"
    # Never half-patched: none of the changed family's own classes was touched.
    own = {c for c in (target_class(FAMILIES[CHANGED], t) for t in FAMILIES[CHANGED].targets)
           if isinstance(c, type) and c.__module__ == FAMILIES[CHANGED].modeling}
    assert not [c for c, _ in REGISTRY.class_patches if c in own]
    with warnings.catch_warnings():
        warnings.simplefilter("error", syncfree.FamilyLeftStock)
        syncfree.patch()  # once per process and release: no second warning


def test_strict_patch_raises_and_patches_nothing(changed_release):
    with pytest.raises(syncfree.UnsupportedTransformers, match=rf"cannot patch {CHANGED}:"):
        syncfree.patch(strict=True)
    assert not REGISTRY.class_patches


def test_instance_of_the_changed_family_is_refused(changed_release):
    from syncfree.presets import build_model

    model = build_model("qwen2-vl-tiny")
    with pytest.raises(syncfree.UnsupportedTransformers, match=r"nearest installed code: .* at modeling_qwen2_vl\.py:"):
        syncfree.patch(model)
    assert not syncfree.is_patched(model)


def test_doctor_exits_1_naming_the_changed_family(changed_release, capsys):
    from syncfree.cli import main

    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    changed = [line for line in out.splitlines() if " CHANGED " in line]
    assert len(changed) == 1 and changed[0].split()[0] == CHANGED
    assert f"leaves {CHANGED} stock" in out


def test_doctor_exits_0_where_everything_matches(capsys):
    from syncfree.cli import main

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name, family in FAMILIES.items():
        status = "matches" if installed(family.modeling) else "absent"
        assert any(line.split()[:2] == [name, status] for line in out.splitlines()), name


def test_census_row_of_a_changed_family_says_why(changed_release):
    from syncfree.census.run import census_family

    row = census_family(CHANGED, graph_breaks=False)
    assert row.status == "ok" and row.support == "changed"
    assert row.stock_syncs and row.patched_syncs is None
    assert row.reason.startswith("left stock:") and "changed" in row.reason


def test_every_installed_family_matches_the_installed_release():
    refused = {name: str(err) for name, f in FAMILIES.items() if installed(f.modeling)
               for err in [check_family(f)] if err is not None}
    assert not refused


def test_moved_code_is_patched_where_the_release_moved_it():
    """Qwen4-Exp's QSA loop is in ``forward`` in one release and ``_select_tokens`` in another: the edit is made
    in whichever holds it, and the class-level patch installs it there."""
    if "qwen4_exp" not in FAMILIES or not installed(FAMILIES["qwen4_exp"].modeling):
        pytest.skip("Qwen4-Exp is not registered on this Transformers release")
    family = FAMILIES["qwen4_exp"]
    target = next(t for t in family.targets if t.alt_attrs)
    cls = target_class(family, target)
    holder = next(a for a in (target.attr, *target.alt_attrs)
                  if "torch.nonzero(" in inspect.getsource(cls.__dict__.get(a, lambda: None)))
    syncfree.unpatch()
    try:
        syncfree.patch(families=("qwen4_exp",))
        assert (cls, holder) in REGISTRY.class_patches
        # (the loop's edit in the method that holds it and in no other; ``forward`` may be patched for edits of its own)
        edited = [a for a in (target.attr, *target.alt_attrs)
                  if "visible_positions" in getattr(cls.__dict__.get(a), "__code__", compile("", "", "exec")).co_names]
        assert edited == [holder]
    finally:
        syncfree.unpatch()


MOVED = '''
def kept_here(x):
    y = x + 1
    return y


class Holder:
    def moved_there(self, visible, batch_idx):
        other = visible.sum()
        found = torch.nonzero(visible[batch_idx, 0], as_tuple=False)
        return found, other
'''


@pytest.fixture
def moved_module(tmp_path, monkeypatch):
    (tmp_path / "sf_moved_code.py").write_text("import torch\n" + textwrap.dedent(MOVED))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("sf_moved_code")
    yield module
    sys.modules.pop("sf_moved_code", None)


def test_nearest_code_finds_code_moved_to_another_function(moved_module):
    near = nearest_code(moved_module.kept_here, "torch.nonzero(visible[batch_idx, 0], as_tuple=False)", "expr")
    qualname, filename, line, code, similarity = near
    assert qualname == "Holder.moved_there" and similarity == 1.0
    assert "torch.nonzero(" in open(filename).read().splitlines()[line - 1]
    assert "sf_moved_code.py:" in near.describe()


def test_nearest_fragment_finds_the_line_holding_most_of_it(moved_module):
    near = nearest_fragment(moved_module.kept_here, "other = visible.sum(dim=0)")
    assert near[0] == "Holder.moved_there" and "visible.sum()" in near[3]


def test_refusal_message_shows_the_nearest_installed_code(changed_release):
    err = check_family(FAMILIES[CHANGED])
    assert err is not None and err.family == CHANGED
    assert "appears 0 times" in err.problem and "nearest installed code:" in err.problem
    assert "segment_lengths" in err.problem  # (the reworded code itself, as the release has it)
    assert "\n" not in str(err)


def test_patching_a_matching_model_after_a_refused_one_still_works(changed_release):
    from syncfree.presets import build_model

    model = build_model("qwen2.5-vl-tiny")
    syncfree.patch(model)
    assert syncfree.is_patched(model)
    syncfree.unpatch(model)
    assert isinstance(model, torch.nn.Module) and not syncfree.is_patched(model)


def test_audit_compare_of_a_changed_family_is_the_stock_audit_and_says_why(changed_release, capsys):
    from syncfree.cli import main

    assert main(["audit", "--compare", "--model", "qwen2-vl-tiny", "--engine", "emulated"]) == 0
    out = capsys.readouterr().out
    assert "not patched: syncfree cannot patch qwen2_vl" in out
    assert "1 audited forward " in out


def test_patch_report_of_a_changed_family_says_why(changed_release, capsys):
    from syncfree.cli import main

    assert main(["patch", "--report", "--model", "qwen2-vl-tiny"]) == 0
    out = capsys.readouterr().out
    assert "not patched: syncfree cannot patch qwen2_vl" in out


def test_bench_of_a_changed_family_lists_it_as_skipped(changed_release):
    from syncfree.bench.runner import BenchConfig, run_matrix

    run = run_matrix(BenchConfig(models=("qwen2-vl-tiny",), scenarios=("image-448",), repeats=1, budget_s=1,
                                 graph_breaks=False))
    assert not run.records and not run.errors
    assert [s["scenario"] for s in run.skipped] == ["image-448"]
    assert "leaves it stock" in run.skipped[0]["why"]
