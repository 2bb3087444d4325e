"""The package's shape: small modules, one registry of family groups that everything else reads, layers
without upward imports (lint-imports, where import-linter is installed: ``pip install -e ".[lint]"``)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import syncfree
from syncfree.families import (
    DISPLAY,
    FAMILIES,
    GROUP_NAMES,
    GROUPS,
    MODEL_CLASSES,
    MODULE_TARGETS,
    PRESETS,
    VISION_CLASSES,
    FamilyGroup,
)
from syncfree.plan.hooks import PlanHooks
from syncfree.plan.spec import Layout, PositionTable, supported_model_types
from syncfree.rewrite.roles import TOWER, does, role_of

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(syncfree.__file__).parent


@pytest.mark.parametrize("family, name", [("llava_onevision1_5", r"llava.?one.?vision"), ("ovis2_5", r"ovis")])
def test_a_family_lives_in_its_folder(family, name):
    """The families added last name themselves nowhere outside ``syncfree/families/<family>/``: not in code, not in
    prose (any spelling: ``ovis2_5``, ``Ovis2_5``, ``Ovis2.5``)."""
    outside = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if "families" not in p.relative_to(PACKAGE).parts and re.search(name, p.read_text(), re.IGNORECASE)]
    assert not outside, f"{family} is named outside its folder: {outside}"


# The shared machinery: the plan and rewrite layers and the verbs that work for any family. A family's own code, and
# its name, live in its folder; here a family is its traits (``Layout``, ``PlanHooks``) and its data (the config).
_SHARED = ("plan", "rewrite", "items.py", "prepare.py", "patching.py", "collate.py", "packing.py", "buckets.py",
           "compile_vision.py", "patch_report.py", "shared_patches.py", "trainer_hook.py", "trainer_rollouts.py")


def _tables():
    spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks" / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    return tables


def _display_names() -> dict[str, str]:
    return _tables().DISPLAY


def _parts(name: str) -> list[str]:
    """``qwen2_5_vl`` -> ``qwen 2 5 vl``; ``Qwen2.5-VL`` the same; ``MiniCPM-V 4.6`` -> ``minicpm v 4 6``."""
    return re.findall(r"[a-z]+|[0-9]+", name.lower())


def _family_spellings() -> list[str]:
    """Every name a family goes by, from the registry: each model type, each group's folder (``qwen_vl``, ``omni``:
    the groups' names), each family's display name (``benchmarks/tables.py``), and the maker's name that every model
    type of a group starts with (``qwen``, ``glm``)."""
    names = set(FAMILIES) | set(GROUP_NAMES)
    names |= {shown for key, shown in _display_names().items()
              if any(t == key or t.startswith(key + "_") for t in FAMILIES)}
    for group in GROUPS:
        makers = {_parts(f.model_type)[0] for f in group.families}
        if len(group.families) > 1 and len(makers) == 1:
            names |= makers
    return sorted(names)


def _spelling_pattern(names) -> re.Pattern:
    """One pattern for every spelling of ``names``: their parts joined by ``_``, ``-``, ``.``, a space or nothing, in
    any case (``qwen2_5_vl``, ``Qwen2.5-VL``, ``Qwen2_5_VL``, ``qwen25vl``), as a whole name: not inside a longer word
    (``museum`` is not ``muse``, ``omnibus`` not ``omni``), though ``_``, a camel-case hump and a version part words
    (``make_omni_rope``, ``Qwen2_5_VLModel``, ``TinyQwen``, ``Qwen3``)."""
    alternatives = sorted((r"[-_. ]?".join(map(re.escape, _parts(n))) for n in names), key=len, reverse=True)
    starts = r"(?:(?<![A-Za-z0-9])|(?<=[a-z0-9])(?=[A-Z]))"
    ends = r"(?:(?![A-Za-z0-9])|(?=[A-Z])|(?<=[A-Za-z])(?=[0-9]))"
    return re.compile(starts + "(?i:" + "|".join(alternatives) + ")" + ends)


_SPELLINGS = _spelling_pattern(_family_spellings())


def test_the_family_check_finds_whole_names_in_any_spelling():
    """The check below finds a family in any of its spellings, and only as a whole name; its names are the registry's,
    the Qwen-VL line's among them."""
    pattern = _spelling_pattern(["qwen2_5_vl", "qwen_vl", "omni", "GLM-4.1V", "MiniCPM-V 4.6", "qwen"])
    text = "qwen2_5_vl, Qwen2.5-VL, Qwen2_5_VLModel, Qwen-VL, make_omni_rope, GLM-4.1V, MiniCPM-V 4.6, TinyQwen3"
    assert pattern.findall(text) == ["qwen2_5_vl", "Qwen2.5-VL", "Qwen2_5_VL", "Qwen-VL", "omni", "GLM-4.1V",
                                     "MiniCPM-V 4.6", "Qwen"]
    assert not _SPELLINGS.findall("a museum, an omnibus, a glimmering cosmology, paddles, coherent, kimono, ovist")
    assert set(FAMILIES) | set(GROUP_NAMES) | {"qwen", "Qwen2.5-VL", "Qwen3-VL"} <= set(_family_spellings())


@pytest.mark.parametrize("shared", _SHARED)
def test_the_shared_code_names_no_family(shared):
    """``plan/``, ``rewrite/`` and the verbs that work for every family hold shared machinery only: they name no
    family, in code or prose, in any spelling (``qwen2_5_vl``, ``Qwen2.5-VL``, ``Qwen-VL``, ``Omni``, ``GLM``). A
    family owns its name; the shared code says the trait (a tower with window attention, a position table resampled
    per grid) and reads a family's values from its config."""
    path = PACKAGE / shared
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    named = {str(p.relative_to(PACKAGE)): sorted(set(_SPELLINGS.findall(p.read_text()))) for p in files}
    named = {path: found for path, found in named.items() if found}
    assert not named, f"the shared code names families: {named}"


def test_every_shared_helper_serves_more_than_one_family_group():
    """A helper of ``rewrite.helpers`` that the edits of one family group alone call is that group's own: it belongs
    in its folder (``Family.helpers``). Those not moved there yet are listed here."""
    not_moved_yet = {"host_index_to"}  # (ERNIE's edits; MiniCPM's wrapper too: shared, under a name for what it does)
    import transformers
    from packaging.version import Version

    from syncfree.rewrite import helpers

    if Version(transformers.__version__) < Version("5.24.0"):  # (older releases lack some families: fewer callers)
        pytest.skip("judged where every family is registered (Transformers 5.24.0 or newer)")
    callers: dict[str, set[str]] = {}
    for group_name, group in zip(GROUP_NAMES, GROUPS):
        for family in group.families:
            for target in family.targets:
                for edit in target.edits:
                    for name in re.findall(r"_syncfree\.(\w+)", edit.new):
                        callers.setdefault(name, set()).add(group_name)
    own = sorted(name for name in helpers.__all__ if len(callers.get(name, ())) == 1 and name not in not_moved_yet)
    assert not own, f"shared helpers one family group's edits alone call: {[(n, *callers[n]) for n in own]}"


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_each_family_group_is_one_folder(name):
    """``syncfree/families/<group>/``: the family's table, edits, plan hooks, wrappers, inputs and presets together."""
    module = importlib.import_module(f"syncfree.families.{name}")
    path = Path(module.__file__)
    assert path.name == "__init__.py" and path.parent.parent == PACKAGE / "families", name
    assert module.GROUP is GROUPS[GROUP_NAMES.index(name)]


@pytest.mark.parametrize("group", GROUPS, ids=GROUP_NAMES)
def test_each_family_group_declares_what_the_registry_reads(group):
    """One ``FamilyGroup`` a folder: its presets, classes and display names are its own families', and each of them
    has a display name (the tables' and the docs')."""
    assert isinstance(group, FamilyGroup)
    own = {f.model_type for f in group.families}
    assert {PRESETS[name].values["model_type"] for name in group.presets} <= own
    assert set(group.vision_classes) <= own and set(group.model_classes) <= own
    assert all(group.handles(t) for t in own)
    shown = [t for t in own if not any(t == key or t.startswith(key + "_") for key in group.display)]
    assert not shown, f"families without a display name: {shown}"


def test_the_tables_show_each_family_by_the_name_its_group_declares():
    """``benchmarks/tables.py`` reads the groups' display names from their source (it imports neither syncfree nor
    torch): the same as the registry's."""
    tables = _tables()
    assert {t: tables.DISPLAY[t] for t in DISPLAY} == DISPLAY
    assert set(tables.DISPLAY) - set(DISPLAY) <= set(tables.NOT_FAMILIES)


def test_every_family_folder_is_registered():
    """A folder under ``syncfree/families/`` is a family group, and the registry lists it (``GROUP_NAMES``): a group
    added without its registry entry would be silently unpatched."""
    folders = {p.parent.name for p in (PACKAGE / "families").glob("*/__init__.py")}
    assert folders == set(GROUP_NAMES), f"unregistered: {folders - set(GROUP_NAMES)}; no folder: {set(GROUP_NAMES) - folders}"


def test_the_registry_is_the_union_of_the_groups_and_the_plan_knows_every_layout():
    assert list(FAMILIES) == [f.model_type for g in GROUPS for f in g.families]
    assert len(FAMILIES) == sum(len(g.families) for g in GROUPS), "a model type is declared by two groups"
    assert set(PRESETS) == {name for g in GROUPS for name in g.presets}
    assert set(VISION_CLASSES) | set(MODEL_CLASSES) <= set(FAMILIES)
    assert set(supported_model_types()) == set(FAMILIES)


def test_every_wrapper_a_target_holds_is_a_module_level_factory():
    """``Target.wrap`` holds the factory itself; ``describe_patch`` names it, so it must be a named function."""
    targets = [t for f in FAMILIES.values() for t in f.targets] + list(MODULE_TARGETS.values())
    odd = sorted({repr(t.wrap) for t in targets if t.wrap is not None
                  and not (callable(t.wrap) and t.wrap.__name__.startswith("make_") and "<" not in t.wrap.__qualname__)})
    assert not odd, f"targets hold wrappers that are not module-level wrapper factories: {odd}"
    # (each says what it does, and a tower's says so: ``patch`` finds a tower by its role, never by its name)
    unsaid = sorted({t.wrap.__name__ for t in targets if t.wrap is not None and not does(t.wrap)})
    assert not unsaid, f"wrapper factories that do not say what they do (rewrite.roles.wrapper): {unsaid}"
    towers = {t.wrap.__name__ for t in targets if t.wrap is not None and role_of(t.wrap) == TOWER}
    assert {t.wrap.__name__ for t in targets if t.attr == "forward" and t.wrap is not None
            and t.wrap.__name__.startswith("make_vision_forward")} <= towers


def test_the_layer_contracts_hold():
    pytest.importorskip("importlinter", reason='import-linter is in the lint extra: pip install -e ".[lint]"')
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if exe is None:
        pytest.skip("lint-imports is not on PATH")
    run = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def test_every_target_that_replaces_a_function_changes_it():
    """A target that is neither check-only nor wrapped must carry edits: one with none would be "patched" with the stock
    function itself (listed as replaced, not replaced)."""
    empty = [f"{family.model_type}: {target.cls}.{target.attr}" for family in FAMILIES.values()
             for target in family.targets if not target.check_only and target.wrap is None and not target.edits]
    assert not empty, empty


# ---- a family is one declared object; what only some families do are small traits it owns -----------------------
def _traits() -> list:
    """Every trait object the registered families declare, and each trait type's default (the shared plan's)."""
    from syncfree.plan import traits

    declared = [getattr(f.layout, field.name) for f in FAMILIES.values() for field in dataclasses.fields(Layout)]
    return ([t for t in declared if dataclasses.is_dataclass(t)]
            + [getattr(traits, name)() for name in traits.__all__] + [PlanHooks()])


def test_a_layout_holds_only_what_several_family_groups_set():
    """``Layout`` has at most 12 fields, each one set (off its default) by the families of two groups or more; what one
    group alone does lives in a trait (``TowerShape``, ``VideoLayout``, ``RotaryIndex``, ``AudioLayout``, ``PlanHooks``,
    ``PositionTable``), whose defaults are the shared plan's."""
    fields = dataclasses.fields(Layout)
    assert len(fields) <= 12, [f.name for f in fields]
    for field in fields:
        if field.name == "modeling":  # (every family's own)
            continue
        setting = {name for name, group in zip(GROUP_NAMES, GROUPS)
                   for f in group.families if getattr(f.layout, field.name) != field.default}
        assert len(setting) >= 2, f"Layout.{field.name} is set by one family group only ({setting}): make it a trait"


def test_every_trait_is_frozen_hashable_and_picklable():
    """A trait is a frozen value: hashable (the vision tables' stock check is cached by the tables' part of the spec,
    traits included), picklable to an equal one (a plan and its spec travel from DataLoader workers), and keyed the same
    in every process (``ModelSpec.key``)."""
    from syncfree.plan.spec import _fields_key
    from syncfree.plan.vision_tables import TowerTables

    traits = _traits()
    assert {type(t).__name__ for t in traits} >= {"TowerShape", "VideoLayout", "RotaryIndex", "AudioLayout",
                                                   "PositionTable", "PlanHooks"}
    for trait in traits:
        assert type(trait).__dataclass_params__.frozen, type(trait).__name__
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(trait, dataclasses.fields(trait)[0].name, None)
        copy = pickle.loads(pickle.dumps(trait))
        assert copy == trait and hash(copy) == hash(trait) and _fields_key(copy) == _fields_key(trait)
    for family in FAMILIES.values():  # (the tables' part of a spec too: hashable, picklable)
        tables = TowerTables(family.layout.modeling, 2, None, None, 16, table=family.layout.table or PositionTable(),
                             tower=family.layout.tower)
        assert pickle.loads(pickle.dumps(tables)) == tables and hash(pickle.loads(pickle.dumps(tables))) == hash(tables)
