"""Per-family config fixes after the generic shrink: the ties a family's config derives once, in ``__post_init__``
(so shrinking a field leaves the derived one stale), and the fields its default leaves unset that its model needs.

Each fix reads the family's configuration_*.py / modeling_*.py rules and runs on the already shrunk config. A family
syncfree supports declares its own in its folder (``FamilyGroup(census_fixes=...)`` of its group, ``families.CENSUS_FIXES``).
"""

from __future__ import annotations

from ..families import CENSUS_FIXES
from ..families.shared import scale_sections

__all__ = ["CENSUS_FIXES", "fix_config", "scale_sections"]


def fix_config(model_type: str, config) -> None:
    fix = CENSUS_FIXES.get(model_type)
    if fix is not None:
        fix(config)
