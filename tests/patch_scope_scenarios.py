"""What a patch changes outside the model is held while something needs it, and put back after.

``patch(model)`` replaces a few module-level functions every model shares and hooks the pickling of bound methods;
the last ``unpatch`` (or the last patched model's death) restores every one of them to the stock object.
"""

from __future__ import annotations

import copy
import copyreg
import gc
import pickle
import sys
import threading
import types

import pytest

import syncfree
from syncfree import shared_patches
from syncfree.families import MODULE_TARGETS
from syncfree.presets import build_model


def _snapshot() -> dict:
    """Every attribute of every loaded Transformers module, and of the classes holding a shared replacement."""
    seen = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers") and hasattr(module, "__dict__"):
            for attr, value in list(vars(module).items()):
                seen[(name, attr)] = value
    for module_name, name in MODULE_TARGETS:
        if "." in name:
            cls = getattr(sys.modules.get(module_name), name.partition(".")[0], None)
            if cls is not None:
                seen[(module_name, name)] = vars(cls).get(name.rpartition(".")[2])
    return seen


def _changed(before: dict) -> list:
    after = _snapshot()
    return sorted(str(k) for k, v in before.items() if k in after and after[k] is not v)


@pytest.fixture
def clean():
    syncfree.unpatch()
    gc.collect()
    assert shared_patches.holders() == 0
    yield
    syncfree.unpatch()


def test_patch_then_unpatch_restores_every_stock_object(clean):
    model = build_model("qwen2.5-vl-tiny")
    before, reducer = _snapshot(), copyreg.dispatch_table.get(types.MethodType)
    syncfree.patch(model)
    assert _changed(before), "the patch replaced no shared function: nothing here is tested"
    syncfree.unpatch(model)
    assert _changed(before) == []
    assert copyreg.dispatch_table.get(types.MethodType) is reducer


def test_shared_functions_stay_while_another_patched_model_needs_them(clean):
    first, second = build_model("qwen2.5-vl-tiny"), build_model("qwen3-vl-tiny")
    before = _snapshot()
    syncfree.patch(first)
    patched = _changed(before)
    syncfree.patch(second)
    syncfree.unpatch(first)
    assert _changed(before) == patched
    syncfree.unpatch(second)
    assert _changed(before) == []


def test_a_patched_model_that_dies_lets_go(clean):
    before = _snapshot()
    model = syncfree.patch(build_model("qwen2.5-vl-tiny"))
    assert _changed(before)
    del model
    gc.collect()
    assert _changed(before) == [] and shared_patches.holders() == 0


def test_a_deep_copy_holds_on_its_own(clean):
    model = syncfree.patch(build_model("qwen2.5-vl-tiny"))
    before_unpatch = _snapshot()
    twin = copy.deepcopy(model)
    assert syncfree.is_patched(twin)
    syncfree.unpatch(model)
    assert _changed(before_unpatch) == []  # (the copy still needs them: nothing was restored)
    syncfree.unpatch(twin)
    gc.collect()
    assert shared_patches.holders() == 0


def test_class_level_unpatch_keeps_what_a_patched_instance_needs(clean):
    model = syncfree.patch(build_model("qwen2.5-vl-tiny"))
    syncfree.patch()
    before = _snapshot()
    syncfree.unpatch()
    assert not [k for k in _changed(before) if any(k == str((m, n)) for m, n in MODULE_TARGETS)]
    assert syncfree.is_patched(model)
    syncfree.unpatch(model)
    assert shared_patches.holders() == 0


class _Plain:
    def method(self):
        return 41


def test_the_pickling_hook_leaves_other_methods_as_python_pickles_them(clean):
    model = syncfree.patch(build_model("qwen2.5-vl-tiny"))
    assert copyreg.dispatch_table.get(types.MethodType) is not None
    plain = _Plain().method
    assert pickle.loads(pickle.dumps(plain))() == 41
    assert plain.__reduce__() == copyreg.dispatch_table[types.MethodType](plain)
    syncfree.unpatch(model)
    assert types.MethodType not in copyreg.dispatch_table


def test_patch_and_unpatch_from_several_threads(clean):
    models = [build_model("qwen2.5-vl-tiny") for _ in range(4)]
    before = _snapshot()
    errors = []

    def work(model):
        try:
            for _ in range(5):
                syncfree.patch(model)
                syncfree.unpatch(model)
            syncfree.patch(model)
        except Exception as exc:  # (reported below: a thread's exception would be lost)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(syncfree.is_patched(m) for m in models) and shared_patches.holders() == len(models)
    for m in models:
        syncfree.unpatch(m)
    assert _changed(before) == [] and shared_patches.holders() == 0


def test_build_cache_keeps_the_generic_and_the_full_rewrite_of_one_function_apart():
    from syncfree import patching
    from syncfree.families import FAMILIES
    from syncfree.patch_registry import target_class
    from syncfree.rewrite.edits import GENERIC_SPLIT
    from syncfree.rewrite.targets import Target

    family = FAMILIES["qwen2_5_vl"]
    full = next(t for t in family.targets if t.edits and t.attr == "forward" and "Attention" in t.cls)
    cls = target_class(family, full)
    stock = patching.stock_function(cls, full.attr, full.inherited)
    generic = Target(cls.__name__, "forward", edits=GENERIC_SPLIT)
    a = patching._build("qwen2_5_vl", "full", full, stock)
    b = patching._build("qwen2_5_vl", "generic", generic, stock)
    assert a is not b
    assert patching._build("qwen2_5_vl", "full", full, stock) is a
