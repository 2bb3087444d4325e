"""Rewrite the few lines of a stock Transformers function that sync, and keep everything else stock.

A patched function is built from the *installed* stock function: its source is parsed, the
syncing expressions or statements are replaced by calls into syncfree (each replacement names
the exact stock code it replaces, and the rewrite is refused if that code is not there, or is
there more or fewer times than expected), and the result is compiled against the stock module's
globals, under the stock file name and line numbers. The stock decorators are not re-run: the
stock wrapper chain (``can_return_tuple``, ``deprecate_kwarg``, ``auto_docstring``, ...) is
cloned around the new inner function. So the signature, defaults, annotations, docstring,
deprecation warnings and every line syncfree does not touch are the stock ones, also after a
Transformers release changes them; tracebacks and audit reports point at the stock lines.

Code in the replacements reaches syncfree through one name, ``_syncfree`` (a closure variable,
so the Transformers module's namespace is left untouched).
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
import types
from dataclasses import dataclass

from .nearest import nearest_code

__all__ = ["Edit", "RewriteError", "rewrite", "stock_chain"]

HELPERS = "_syncfree"


class RewriteError(RuntimeError):
    """The stock function is not the code an edit was written for."""


@dataclass(frozen=True)
class Edit:
    """Replace stock code by new code.

    ``kind``: ``"expr"`` replaces every expression whose normalized source is ``old``;
    ``"stmt"`` replaces every statement whose normalized source is ``old`` by the statements
    in ``new``; ``"prepend"`` puts the statements in ``new`` first in the body (``old`` empty).
    ``"lazy"`` makes the message argument (the second) of every call of the function named ``old`` a
    ``lambda`` returning it, where that argument is an f-string: Transformers' ``torch_compilable_check``
    takes either and formats a callable's only when the check fails (the same message), and a traced
    forward then never formats a symbolic size into a string, which Dynamo cannot do.
    ``count`` is how many matches the stock code must have (Transformers releases that add or
    drop an occurrence are refused rather than half-patched); None: any number (an edit that only
    helps where the code is there).
    """

    kind: str
    old: str
    new: str
    count: int | None = 1

    def normalized_old(self) -> str:
        return self.old if self.kind == "lazy" else _normalize(self.old, self.kind)


def _normalize(code: str, kind: str) -> str:
    tree = ast.parse(textwrap.dedent(code), mode="eval" if kind == "expr" else "exec")
    return ast.unparse(tree)


def stock_chain(fn) -> list:
    """``fn`` and the functions it wraps (``__wrapped__``), outermost first; the last is the plain function."""
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    return chain


class _Replacer(ast.NodeTransformer):
    def __init__(self, edits: list[Edit]) -> None:
        self.expr = {e.normalized_old(): e for e in edits if e.kind == "expr"}
        self.stmt = {e.normalized_old(): e for e in edits if e.kind == "stmt"}
        self.lazy = {e.old: e for e in edits if e.kind == "lazy"}
        self.hits = {e: 0 for e in edits if e.kind != "prepend"}
        self.lines: dict[Edit, list[int]] = {e: [] for e in self.hits}  # where each match stands in the stock file

    def visit(self, node):
        if isinstance(node, ast.stmt) and self.stmt:
            edit = self.stmt.get(ast.unparse(node))
            if edit is not None:
                self.hits[edit] += 1
                self.lines[edit].append(node.lineno)
                new = ast.parse(textwrap.dedent(edit.new)).body
                for n in new:
                    for sub in ast.walk(n):
                        ast.copy_location(sub, node)
                return new
        if isinstance(node, ast.Call) and self.lazy and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.JoinedStr):
            edit = self.lazy.get(ast.unparse(node.func))
            if edit is not None:
                self.hits[edit] += 1
                self.lines[edit].append(node.lineno)
                message = node.args[1]
                node.args[1] = ast.copy_location(ast.Lambda(args=ast.arguments(
                    posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]), body=message), message)
        if isinstance(node, ast.expr) and self.expr:
            edit = self.expr.get(ast.unparse(node))
            if edit is not None:
                self.hits[edit] += 1
                self.lines[edit].append(node.lineno)
                new = ast.parse(textwrap.dedent(edit.new), mode="eval").body
                for sub in ast.walk(new):
                    ast.copy_location(sub, node)
                return new
        return self.generic_visit(node)


def _function_node(fn) -> tuple[ast.FunctionDef, str, int]:
    lines, first = inspect.getsourcelines(fn)
    source = textwrap.dedent("".join(lines))
    tree = ast.parse(source)
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name != fn.__name__:
        raise RewriteError(f"the source of {fn.__qualname__} is not a plain function definition")
    # Line numbers as in the stock file (the decorators' lines come first in `lines`).
    ast.increment_lineno(tree, first - 1)
    return node, inspect.getsourcefile(fn), first


def _compile(node: ast.FunctionDef, filename: str, plain, helpers) -> types.FunctionType:
    """Compile ``node`` as a function with the stock globals and ``_syncfree`` as a closure variable.

    A method is compiled inside a class of the same name (so private names are mangled as in stock and
    ``super()`` compiles), and then given the stock ``__class__`` cell, so ``super()`` finds the real class.
    """
    node.decorator_list = []
    owner = plain.__qualname__.split(".")[-2] if "." in plain.__qualname__ else None
    if owner is not None and owner != "<locals>":
        holder = ast.ClassDef(name=owner, bases=[], keywords=[], body=[node], decorator_list=[])
        if "type_params" in ast.ClassDef._fields:  # Python >= 3.12
            holder.type_params = []
        body = [holder, ast.Return(value=ast.Subscript(
            value=ast.Attribute(value=ast.Name(id=owner, ctx=ast.Load()), attr="__dict__", ctx=ast.Load()),
            slice=ast.Constant(node.name), ctx=ast.Load()))]
    else:
        body = [node, ast.Return(value=ast.Name(id=node.name, ctx=ast.Load()))]
    factory = ast.FunctionDef(
        name="__syncfree_factory__",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=HELPERS)], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body, decorator_list=[], returns=None,
    )
    if "type_params" in ast.FunctionDef._fields:  # Python >= 3.12
        factory.type_params = []
    module = ast.Module(body=[factory], type_ignores=[])
    for extra in [factory] + body:
        ast.copy_location(extra, node)
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec")
    scope: dict = {}
    # Separate locals: the factory lands there, the function's globals are the stock module's.
    exec(code, plain.__globals__, scope)
    made = scope["__syncfree_factory__"](helpers)
    stock_cells = dict(zip(plain.__code__.co_freevars, plain.__closure__ or ()))
    cells = tuple(stock_cells.get(name, cell) for name, cell in zip(made.__code__.co_freevars, made.__closure__ or ()))
    new = types.FunctionType(made.__code__, made.__globals__, made.__name__, plain.__defaults__, cells or None)
    # The very objects stock has (not re-evaluated copies), so signatures compare equal.
    new.__kwdefaults__ = plain.__kwdefaults__
    new.__annotations__ = dict(plain.__annotations__)
    new.__doc__ = plain.__doc__
    new.__qualname__ = plain.__qualname__
    new.__module__ = plain.__module__
    new.__dict__.update({k: v for k, v in plain.__dict__.items() if k != "__wrapped__"})
    return new


def _rewrap(wrapper, old_inner, new_inner):
    """A copy of the decorator-made ``wrapper`` that calls ``new_inner`` where it called ``old_inner``."""
    cells = wrapper.__closure__ or ()
    hits = [i for i, c in enumerate(cells) if _cell_value(c) is old_inner]
    if len(hits) != 1:
        raise RewriteError(f"cannot rebuild the decorator {wrapper.__qualname__} around the patched function")
    closure = tuple(types.CellType(new_inner) if i == hits[0] else c for i, c in enumerate(cells))
    new = types.FunctionType(wrapper.__code__, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__, closure)
    new.__kwdefaults__ = wrapper.__kwdefaults__
    new.__dict__.update(wrapper.__dict__)
    new.__wrapped__ = new_inner
    for attr in ("__qualname__", "__doc__", "__module__", "__annotations__"):
        setattr(new, attr, getattr(wrapper, attr))
    return new


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _miscount(plain, filename: str, edit: Edit, found: int, lines: list[int]) -> str:
    """Why ``edit`` does not apply, with what a maintainer needs to mend it: where the code stands if it is there
    too often, else the installed code nearest to it (often the same code, moved to another function)."""
    said = f"the code {edit.normalized_old()!r} appears {found} times, not {edit.count}"
    if found:
        return f"{said} (at {os.path.basename(filename)}:{', '.join(map(str, lines))})"
    near = nearest_code(plain, edit.old, edit.kind)
    return f"{said}; nearest installed code: {near.describe()}" if near is not None else said


# Every rewritten function's check messages formatted only when a check fails (``"lazy"``): the same message, and a
# forward traced with dynamic shapes never formats a symbolic size (which Dynamo cannot).
LAZY_CHECK_MESSAGES = Edit("lazy", "torch_compilable_check", "", count=None)


def rewrite(stock, edits: list[Edit], helpers, where: str):
    """The stock function ``stock`` (decorated or not) with ``edits`` applied to its innermost function.

    ``helpers`` is what the new code calls ``_syncfree``. ``where`` names the function in errors.
    Raises ``RewriteError`` naming the stock code that was not found as expected.
    """
    if isinstance(stock, staticmethod):  # (a class attribute: the function inside, wrapped alike)
        return staticmethod(rewrite(stock.__func__, edits, helpers, where))
    if isinstance(stock, classmethod):
        raise RewriteError(f"{where} is a classmethod, which syncfree does not rewrite")
    chain = stock_chain(stock)
    plain = chain[-1]
    unknown = set(plain.__code__.co_freevars) - {"__class__"}
    if unknown:
        raise RewriteError(f"{where} uses closure variables {sorted(unknown)}")
    node, filename, _ = _function_node(plain)
    replacer = _Replacer([*edits, LAZY_CHECK_MESSAGES])
    node.body = [replacer.visit(stmt) for stmt in node.body]
    node.body = [s for item in node.body for s in (item if isinstance(item, list) else [item])]
    problems = [_miscount(plain, filename, e, n, replacer.lines[e]) for e, n in replacer.hits.items()
                if e.count is not None and n != e.count]
    if problems:
        raise RewriteError("; ".join(problems))
    prepend = [s for e in edits if e.kind == "prepend" for s in ast.parse(textwrap.dedent(e.new)).body]
    if prepend:
        body = node.body
        at = 1 if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                                      ast.Constant) else 0
        anchor = body[at] if at < len(body) else body[-1]
        for s in prepend:
            for sub in ast.walk(s):
                ast.copy_location(sub, anchor)
        node.body = body[:at] + prepend + body[at:]
    new = _compile(node, filename, plain, helpers)
    # Rebuild the stock decorator chain, innermost first.
    for wrapper, old_inner in zip(reversed(chain[:-1]), reversed(chain[1:])):
        new = _rewrap(wrapper, old_inner, new)
    return new
