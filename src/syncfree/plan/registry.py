"""The one registry syncfree keeps: the families it patches and their input layouts, the control inputs those
layouts declare, and what ``patch`` has replaced. Filled by ``syncfree.families`` when syncfree is imported (one
family group after another), by ``syncfree.register_family``, and for as long as a model patched ``like=`` a family
is patched (``scoped``); read by the plan, ``patch``, ``prepare`` and the reports.

It lives in the plan layer because the plan reads the layouts: it holds a family (a ``syncfree.Family``) as the
layers above declare it, without knowing its type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Registry", "REGISTRY"]


@dataclass(eq=False)
class Registry:
    """The tables, one per field; a field is read and filled in place (never rebound)."""

    families: dict[str, Any] = field(default_factory=dict)  # model type -> its ``syncfree.Family``
    # model type -> its ``spec.Layout`` (a family's, and a tower's alone under its module's name, ``modeling_<x>``)
    layouts: dict[str, Any] = field(default_factory=dict)
    # The control inputs the registered layouts declare beyond the shared ones, in registration order.
    inputs: dict[str, None] = field(default_factory=dict)
    # The ``spec.ModelSpec`` ``prepare(batch)`` assumes without a model (one family group declares it).
    assumed: list[Any] = field(default_factory=list)
    # What ``patch`` has replaced: ``patching`` fills these, ``patch_report`` reads them back.
    class_patches: dict[tuple[type, str], object] = field(default_factory=dict)  # (class, attr) -> stock (or INHERITED)
    module_patches: dict[tuple[str, str], tuple] = field(default_factory=dict)  # (module, fn) -> (stock, new, holders)
    built: dict[object, object] = field(default_factory=dict)  # stock function -> its replacement
    origin: dict[object, tuple[str, str, str]] = field(default_factory=dict)  # replacement -> (module, class, attr)
    how: dict[object, Any] = field(default_factory=dict)  # replacement -> the Target it was built from
    # model type -> [how many scopes hold it, (the family and the layouts it replaced)]
    _scoped: dict[str, list] = field(default_factory=dict, repr=False)
    _inputs_before: dict[str, None] = field(default_factory=dict, repr=False)  # (the inputs before the first scope)

    def add_layout(self, name: str, layout, shared_inputs: tuple[str, ...]) -> None:
        """Register ``layout`` under ``name``, and the inputs it declares beyond ``shared_inputs``."""
        self.layouts[name] = layout
        for input_name in layout.plan.inputs:
            if input_name not in shared_inputs:
                self.inputs.setdefault(input_name)

    def scoped(self, key: str, names: tuple[str, ...], register: Callable[[], None]) -> Callable[[], None]:
        """Run ``register`` (which registers the family ``key`` and layouts under ``names``) and return its release:
        the last release of ``key`` puts the family and those layouts back as they were before the first, and the
        last release of all puts the declared inputs back (keeping those of the layouts still registered)."""
        entry = self._scoped.get(key)
        if entry is None:
            if not self._scoped:
                self._inputs_before = dict(self.inputs)
            entry = self._scoped[key] = [0, (self.families.get(key), {n: self.layouts.get(n) for n in names})]
        register()
        entry[0] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            entry[0] -= 1
            if entry[0] == 0 and self._scoped.get(key) is entry:
                del self._scoped[key]
                before, layouts = entry[1]
                _put(self.families, key, before)
                for name, layout in layouts.items():
                    _put(self.layouts, name, layout)
                if not self._scoped:  # (the inputs as before the first scope, and those of what stays registered)
                    kept = {n: None for layout in self.layouts.values() for n in layout.plan.inputs if n in self.inputs}
                    self.inputs.clear()
                    self.inputs.update(self._inputs_before)
                    self.inputs.update(kept)

        return release


def _put(table: dict, key: str, value) -> None:
    """``table[key] = value``, or no entry for None."""
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


REGISTRY = Registry()
