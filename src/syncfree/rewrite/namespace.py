"""The ``_syncfree`` a family's rewritten code sees: the shared helpers (``rewrite.helpers``) with the family's own
laid over them.

A family's own helpers (its NaViT tables, its indexer's counts) live in its folder (``syncfree.families.<family>``),
which this layer cannot import: the family hands them over (``Family.helpers``) and its targets' edits are compiled
against the namespace made here. A shared helper is never replaced by a family's: an edit written against the shared
one would call the family's without a word, so a name both have is refused when the family is made.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

from . import helpers as shared

__all__ = ["FamilyHelpers", "helpers_for"]


class FamilyHelpers:
    """The family's own helpers as attributes, every other name looked up in the shared helpers module at call
    time (so a shared helper swapped on that module, as tests do, is the one called)."""

    def __init__(self, own: Mapping[str, object]) -> None:
        self.__dict__.update(own)

    def __getattr__(self, name: str):
        return getattr(shared, name)

    def __repr__(self) -> str:
        return f"<syncfree helpers {sorted(self.__dict__)} over {shared.__name__}>"


# helpers module -> its namespace: a fork of a family (``patch(like=...)``) and the family share one, and so share
# what the build cache (keyed on the namespace) holds.
_made: dict[types.ModuleType, FamilyHelpers] = {}


def _own(owner: str, source) -> dict[str, object]:
    """``source``'s helpers by name: a module's ``__all__`` (its exported names, nothing it merely imports), or a
    mapping's items."""
    if isinstance(source, types.ModuleType):
        names = getattr(source, "__all__", None)
        if names is None:
            raise ValueError(f"syncfree: the helpers module {source.__name__} of {owner} has no __all__ (the names "
                             "its rewritten code may call must be listed)")
        return {name: getattr(source, name) for name in names}
    if isinstance(source, Mapping):
        return dict(source)
    raise TypeError(f"syncfree: {owner}'s helpers are a module or a mapping of names to helpers, got "
                    f"{type(source).__name__}")


def helpers_for(owner: str, source=None):
    """What the rewritten code of ``owner``'s targets calls ``_syncfree``: the shared helpers module itself where
    ``source`` is None, else a ``FamilyHelpers`` over it with ``source``'s helpers (a module, by its ``__all__``, or
    a mapping; one namespace per module). Raises ``ValueError`` where one of them would shadow a shared name or is not
    a public identifier."""
    if source is None:
        return shared
    if isinstance(source, types.ModuleType) and source in _made:
        return _made[source]
    own = _own(owner, source)
    odd = sorted(name for name in own if not (isinstance(name, str) and name.isidentifier()) or name.startswith("_"))
    if odd:
        raise ValueError(f"syncfree: {owner}'s helpers {odd} are not public names rewritten code can call")
    clash = sorted(name for name in own if hasattr(shared, name))
    if clash:
        raise ValueError(f"syncfree: {owner}'s own helpers {clash} would shadow the shared helpers of the same name "
                         f"in {shared.__name__}: rename them (an edit written for the shared one would call the "
                         "family's)")
    made = FamilyHelpers(own)
    if isinstance(source, types.ModuleType):
        _made[source] = made
    return made
