"""What syncfree patches, as data: a ``Target`` is one stock function (the lines rewritten in it and/or
the wrapper put around it), a ``Family`` a model type's targets with its input layout.

The tables themselves live with each family (``syncfree.families``); this module only says their shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..plan.spec import Layout
from .namespace import helpers_for
from .rewriter import Edit

__all__ = ["Target", "Family"]


@dataclass(frozen=True)
class Target:
    cls: str  # class name in the family's modeling module (or, for module-level targets, a function name)
    attr: str
    edits: tuple[Edit, ...] = ()
    # The wrapper factory, called with the stock function (its edits made) for the function put in its place; a
    # module-level function, so that ``describe_patch`` can name it (``__name__``) and a Target stays hashable.
    wrap: Callable | None = None
    params: tuple[str, ...] = ()  # parameters the stock function must take (for the wrapper)
    needs: tuple[str, ...] = ()  # code the stock function must contain (for the wrapper)
    inherited: bool = False  # the stock function may come from a base class (GenerationMixin.generate)
    optional: bool = False  # skipped where the stock function or the edited code is absent (older releases)
    fallback_cls: str | None = None  # the class holding the function in releases without ``cls``
    module: str | None = None  # the modeling module holding ``cls``, where not the family's (a borrowed tower)
    check_only: bool = False  # only checked (its ``needs``: code a wrapper elsewhere relies on), never replaced
    # Other methods of ``cls`` that hold the edited code in other releases (Transformers 5.25 moved a text model's
    # token indexer loop from ``forward`` into ``_select_tokens``): tried in order where ``attr`` does not match; the first that
    # matches is patched, and the refusal, where none does, is ``attr``'s.
    alt_attrs: tuple[str, ...] = ()
    # A class other families borrow whole (a text model's layer, run under another family's tower): patched with the
    # family, but holding it does not make a model of this family (``patch_registry.family_classes``).
    borrowed: bool = False


@dataclass(frozen=True)
class Family:
    """A fully supported model type: its targets, and how it lays out its inputs (``layout``, for the plan).

    ``helpers``: the family's own helpers its edits call (a module, by its ``__all__``, or a mapping of names), which
    its targets' rewritten code sees under ``_syncfree`` besides the shared ones (``rewrite.helpers``); a name the
    shared helpers have is refused here (``ValueError``). ``namespace`` is that ``_syncfree``, made once."""

    model_type: str
    targets: tuple[Target, ...]
    layout: Layout
    helpers: object = field(default=None, hash=False)
    namespace: object = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        # (Made once per Family: the build cache is keyed on it, so every build of the family shares one.)
        object.__setattr__(self, "namespace", helpers_for(self.model_type, self.helpers))

    @property
    def modeling(self) -> str:
        return self.layout.modeling
