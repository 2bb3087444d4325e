"""What ``syncfree.patch`` did to a model, read back from the model itself: every stock function it replaced,
which stock lines were rewritten in it and which wrapper runs it (``patch(model, verbose=True)`` prints this;
``syncfree patch --report`` adds the syncs an emulated forward still makes, by source line)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import patch_registry as registry
from .plan.registry import REGISTRY
from .rewrite.generic import GENERIC_NOTE
from .rewrite.roles import does

__all__ = ["PatchedFunction", "PatchDescription", "describe_patch"]

@dataclass(frozen=True)
class PatchedFunction:
    where: str  # "Class.attr", or "module.function" for a function every model shares
    modules: int  # modules of the model running it (0: patched on the class or module, for every model)
    rewrote: tuple[str, ...]  # the stock code each edit replaced, one line each
    wrapper: str | None  # the wrapper factory's name, if the function is wrapped
    does: str | None = None  # what that wrapper does, in a line (``rewrite.roles.wrapper``)

    def line(self) -> str:
        count = f" (x{self.modules})" if self.modules > 1 else ""
        parts = []
        if self.rewrote:
            parts.append(f"rewrote {len(self.rewrote)} stock line{'s' if len(self.rewrote) > 1 else ''}: "
                         + "; ".join(f"`{code}`" for code in self.rewrote))
        if self.wrapper:
            parts.append(f"wrapped: {self.does or self.wrapper}")
        return f"{self.where}{count}: {'; '.join(parts) or 'replaced'}"


@dataclass(frozen=True)
class PatchDescription:
    model: str  # the model's class name
    model_types: tuple[str, ...]
    support: str  # "full" (a family syncfree fully supports), "generic" or "none" (not patched)
    family: str | None
    functions: tuple[PatchedFunction, ...]  # the model's own modules
    shared: tuple[PatchedFunction, ...]  # Transformers' module-level functions, patched for every model

    def lines(self, audit_hint: bool = True) -> list[str]:
        """The description, a line per function; ``audit_hint``: end with how to list the syncs left (not where the
        caller is that command, which lists them next)."""
        if self.support == "none":
            return [f"syncfree: {self.model} ({', '.join(self.model_types) or 'no model type'}) is not patched"]
        kind = f"{self.family}, full support" if self.support == "full" else f"{', '.join(self.model_types)}, generic fix"
        out = [f"syncfree: patched {self.model} ({kind}): {len(self.functions) + len(self.shared)} functions"]
        out += [f"  {f.line()}" for f in self.functions + self.shared]
        if self.support == "generic":
            out.append(f"  left as stock: {GENERIC_NOTE.split('; ', 1)[1]}")
        if audit_hint:
            out.append("  (syncfree patch --report --model MODEL audits a forward on the emulated device and lists "
                       "every sync left, by source line)")
        return out


def _one_line(edit, width: int = 72) -> str:
    text = " ".join(edit.normalized_old().split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _function(where: str, modules: int, replacement) -> PatchedFunction:
    target = REGISTRY.how.get(replacement)
    if target is None:
        return PatchedFunction(where, modules, (), None)
    stock = _stock_source(replacement)
    # (an edit that applies only where its code is there, ``count=None``, is listed where the stock code has it)
    rewrote = tuple(_one_line(e) for e in target.edits if e.kind != "prepend"
                    and (e.count is not None or stock is None or e.normalized_old() in stock))
    return PatchedFunction(where, modules, rewrote, target.wrap.__name__ if target.wrap is not None else None,
                           does(target.wrap) if target.wrap is not None else None)


def _stock_source(replacement) -> str | None:
    """The normalized source of the stock function ``replacement`` replaced (None where unknown)."""
    import ast
    import inspect
    import textwrap

    stock = next((key[0] if isinstance(key, tuple) else key for key, r in REGISTRY.built.items() if r is replacement),
                 None)  # (keyed by the stock function, or by (stock function, target, namespace))
    while stock is not None and hasattr(stock, "__wrapped__"):
        stock = stock.__wrapped__
    try:
        return ast.unparse(ast.parse(textwrap.dedent(inspect.getsource(stock)))) if stock is not None else None
    except (OSError, TypeError, SyntaxError):
        return None


def describe_patch(model: torch.nn.Module) -> PatchDescription:
    """What ``syncfree.patch`` replaced in ``model`` (an instance patch, or the classes its modules are of), and the
    module-level functions it replaced for every model."""
    counts: dict[str, tuple[int, object]] = {}
    for module in model.modules():
        for cls in type(module).__mro__:
            for attr, value in vars(cls).items():
                if (cls, attr) in REGISTRY.class_patches and value in REGISTRY.how:
                    where = f"{cls.__name__}.{attr}"
                    counts[where] = (0, value)
        for attr, value in module.__dict__.items():
            func = getattr(value, "__func__", None)
            if func in REGISTRY.origin:
                where = f"{REGISTRY.origin[func][1]}.{attr}"
                counts[where] = (counts.get(where, (0, None))[0] + 1, func)
    functions = tuple(_function(where, n, fn) for where, (n, fn) in counts.items())
    shared = tuple(_function(f"{module}.{name}", 0, replacement)
                   for (module, name), (_stock, replacement, _holders) in REGISTRY.module_patches.items())
    family = registry.family_of(model)
    support = "none" if not functions else ("full" if family is not None else "generic")
    return PatchDescription(type(model).__name__, tuple(registry.model_types(model)), support,
                            family.model_type if family is not None else None, functions,
                            shared if support == "full" else ())
