"""Where the stock code an edit expects went: the installed code nearest to it, for refusal messages.

A new Transformers release that rewrites a modeling file leaves some of syncfree's edits without the code they
replace. The one who updates syncfree then needs to see, per broken edit, what the release has instead: the
installed code most like the expected code, with its function, file and line. It is usually the same code moved
to another method, reworded, or split over other names; finding it by eye in a 3,000-line modeling file takes
long, so every refusal carries it.

Nearness is difflib's ratio over the code without its white space. For an edit (a whole expression or
statement) the candidates are the installed module's expressions or statements of a similar length; for a
wrapper's ``needs`` (a fragment of code, not always parseable) they are the module's lines, scored by how much of
the fragment they hold.
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import os

__all__ = ["Nearest", "nearest_code", "nearest_fragment"]


class Nearest(tuple):
    """(qualified name of the enclosing function, file, line, the code there, similarity in [0, 1])."""

    __slots__ = ()

    def __new__(cls, qualname: str, filename: str, line: int, code: str, similarity: float):
        return super().__new__(cls, (qualname, filename, line, code, similarity))

    def describe(self) -> str:
        qualname, filename, line, code, similarity = self
        shown = code if len(code) <= 160 else code[:157] + "..."
        how = "the same code" if similarity == 1.0 else f"{similarity:.0%} alike"
        return f"{qualname or 'module level'} at {os.path.basename(filename)}:{line} ({how}): {shown}"


def _collapse(code: str) -> str:
    return " ".join(code.split())


@functools.lru_cache(maxsize=32)
def _nodes(filename: str, mtime: float) -> tuple[tuple[str, str, int, str], ...]:
    """(kind, enclosing function, line, code) for every statement and expression of the file."""
    with open(filename, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines(keepends=True)
    found: list[tuple[str, str, int, str]] = []

    def segment(node) -> str:
        if node.lineno == node.end_lineno:
            return lines[node.lineno - 1][node.col_offset:node.end_col_offset]
        first = lines[node.lineno - 1][node.col_offset:]
        middle = "".join(lines[node.lineno:node.end_lineno - 1])
        return first + middle + lines[node.end_lineno - 1][:node.end_col_offset]

    def visit(node, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            elif isinstance(child, (ast.stmt, ast.expr)) and getattr(child, "end_lineno", None):
                found.append(("stmt" if isinstance(child, ast.stmt) else "expr", scope, child.lineno,
                              _collapse(segment(child))))
            visit(child, inner)

    visit(ast.parse(source), "")
    return tuple(found)


def _source_file(fn) -> str | None:
    try:
        return inspect.getsourcefile(inspect.unwrap(fn))
    except (TypeError, OSError):
        return None


def _module_nodes(fn):
    filename = _source_file(fn)
    if filename is None or not os.path.isfile(filename):
        return None, ()
    return filename, _nodes(filename, os.path.getmtime(filename))


def nearest_code(fn, code: str, kind: str) -> Nearest | None:
    """The expression (``kind="expr"``) or statement (``"stmt"``) of ``fn``'s module most like ``code``."""
    filename, nodes = _module_nodes(fn)
    want = "".join(code.split())  # (compared without white space: a call broken over lines is the same code)
    best, best_score = None, 0.0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(want)
    for node_kind, scope, line, text in nodes:
        if node_kind != kind and kind != "prepend" or not len(want) / 2 <= len(text) <= 2 * len(want):
            continue
        matcher.set_seq1("".join(text.split()))
        if matcher.real_quick_ratio() <= best_score or matcher.quick_ratio() <= best_score:
            continue
        score = matcher.ratio()
        if score > best_score:
            best, best_score = (scope, filename, line, text), score
    return None if best is None else Nearest(*best, round(best_score, 2) if best_score < 1 else 1.0)


def nearest_fragment(fn, fragment: str) -> Nearest | None:
    """The line of ``fn``'s module holding the most of ``fragment`` (a piece of code a wrapper relies on)."""
    filename, nodes = _module_nodes(fn)
    want = "".join(fragment.split())
    best, best_score = None, 0.0
    seen = set()
    for _kind, scope, line, text in nodes:
        if line in seen:
            continue
        seen.add(line)
        squeezed = "".join(text.split())
        match = difflib.SequenceMatcher(None, squeezed, want, autojunk=False).find_longest_match(
            0, len(squeezed), 0, len(want))
        score = match.size / max(len(want), 1)
        if score > best_score:
            best, best_score = (scope, filename, line, text), score
    return None if best is None else Nearest(*best, round(best_score, 2) if best_score < 1 else 1.0)

