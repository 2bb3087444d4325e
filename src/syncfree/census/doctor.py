"""``syncfree doctor``: does syncfree's patch still match the installed Transformers, family by family?

The first command to run after upgrading Transformers. For every family with the packed vision split (as the
census finds them) and every fully supported family, one line:

- ``matches``: fully supported, and every function the patch rewrites or wraps is the code it was written for;
- ``CHANGED``: fully supported, but the installed code of one function differs; the next lines say which
  function, what the patch expects, and the installed code nearest to it (file and line), so that whoever
  updates syncfree sees each broken edit at once;
- ``generic``: not fully supported; ``syncfree.patch(model)`` applies the generic fix of its vision split;
- ``none``: the split is there, but not in a shape the generic fix knows;
- ``absent``: fully supported by syncfree, but not in this Transformers release.

Nothing is patched or built beyond the replacement functions themselves (no model, no weights). The exit
status is 1 where a family syncfree claims to support no longer matches, so CI can gate on it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["DoctorRow", "diagnose", "run_doctor_command", "NEWEST_TESTED"]

# The newest Transformers release syncfree was tested against (the oldest is 5.17.0).
NEWEST_TESTED = "5.25.0"


@dataclass
class DoctorRow:
    family: str
    status: str  # "matches", "CHANGED", "generic", "none", "absent"
    detail: str = ""  # CHANGED: the function that differs and how; generic / absent: a short note
    problem: str = ""  # CHANGED: what differs, with the nearest installed code

    @property
    def broken(self) -> bool:
        return self.status == "CHANGED"


def diagnose() -> list[DoctorRow]:
    """One row per family (fully supported ones first, in the family table's order; then the rest, sorted), and a
    last one for the module-level functions every model shares, where one of them changed."""
    from ..families import FAMILIES
    from ..patch_registry import installed
    from ..patching import check_family, check_shared_functions
    from .run import discover, support_level

    rows = []
    for name, family in FAMILIES.items():
        if not installed(family.modeling):
            rows.append(DoctorRow(name, "absent", "not in this Transformers release"))
            continue
        err = check_family(family)
        rows.append(DoctorRow(name, "matches") if err is None else DoctorRow(name, "CHANGED", err.where, err.problem))
    covered = set(FAMILIES) | {n.removesuffix("_thinker") for n in FAMILIES}
    for name in discover():
        if name in covered:
            continue
        level = support_level(name)
        rows.append(DoctorRow(name, level, "the generic fix of its vision attention split" if level == "generic"
                              else "its split is not the shape the generic fix rewrites"))
    for err in check_shared_functions():
        rows.append(DoctorRow("(shared functions)", "CHANGED", err.where, err.problem))
    return rows


def _versions() -> str:
    import torch
    import transformers

    newer = _newer_than_tested(transformers.__version__)
    return (f"torch {torch.__version__}, Transformers {transformers.__version__} (syncfree is tested with 5.17.0 "
            f"through {NEWEST_TESTED}{'; this release is newer' if newer else ''})")


def _newer_than_tested(version: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release > Version(NEWEST_TESTED).release
    except InvalidVersion:
        return False


def report(rows: list[DoctorRow]) -> str:
    from ..display import text_table

    cells = []
    for r in rows:
        cells.append((r.family, r.status, r.detail))
        if r.problem:  # (on a line of its own, under the detail)
            cells.append(("", "", r.problem))
    lines = [text_table(None, cells, align="lll")]
    counts = {s: sum(r.status == s for r in rows) for s in ("matches", "CHANGED", "generic", "none", "absent")}
    lines.append("")
    lines.append(f"{counts['matches']} fully supported and matching, {counts['CHANGED']} changed, {counts['generic']} "
                 f"with the generic fix only, {counts['none']} not supported, {counts['absent']} not in this release")
    return "\n".join(lines)


def run_doctor_command(args: argparse.Namespace) -> int:
    rows = diagnose()
    if args.families:
        unknown = sorted(set(args.families) - {r.family for r in rows})
        if unknown:
            raise ValueError(f"--families {' '.join(unknown)}: no such family in syncfree's table or with the packed "
                             "vision split in the installed Transformers (run without --families to list them)")
        rows = [r for r in rows if r.family in args.families or r.family == "(shared functions)"]
    print(f"syncfree doctor: {_versions()}\n")
    print(report(rows))
    broken = [r.family for r in rows if r.broken]
    if broken:
        print(f"\nsyncfree.patch() leaves {', '.join(broken)} stock on this release (patch(model) refuses them); "
              "every other family is patched")
    return 1 if broken else 0
