"""The AST rewriter on the kinds of class attribute stock code defines: a ``staticmethod`` is rewritten through the
function inside it and stays one; a ``classmethod`` is refused with a message naming it."""

from __future__ import annotations

import pytest

from syncfree.rewrite import helpers
from syncfree.rewrite.rewriter import Edit, RewriteError, rewrite

_EDIT = [Edit("expr", "grid.tolist()", "list(reversed(grid.tolist()))")]


class _Holder:
    @staticmethod
    def rows(grid):
        return grid.tolist()

    @classmethod
    def rows_of(cls, grid):
        return grid.tolist()


class _Grid:
    def tolist(self):
        return [1, 2, 3]


def test_a_staticmethod_is_rewritten_inside_and_stays_a_staticmethod():
    new = rewrite(_Holder.__dict__["rows"], _EDIT, helpers, "_Holder.rows")
    assert isinstance(new, staticmethod)
    assert new.__func__(_Grid()) == [3, 2, 1]
    assert _Holder.rows(_Grid()) == [1, 2, 3]  # (stock untouched)


def test_a_classmethod_is_refused_by_name():
    with pytest.raises(RewriteError, match="_Holder.rows_of is a classmethod"):
        rewrite(_Holder.__dict__["rows_of"], _EDIT, helpers, "_Holder.rows_of")
