"""The command line's tables and progress displays, drawn in one place, by rich.

Every table the ``syncfree`` commands print (the audit report, the comparisons, bench, census and doctor) and
every progress display they show goes through this module, so they all look alike and none is drawn by hand:

- ``text_table`` renders a table to plain text (no colour, no markup, ASCII only), so it can be printed, logged,
  written to a file or put in an exception message like any string. A header line, one ``-`` rule, then one line
  per row.
- ``step_progress`` shows a bar for work with a known number of steps (census families, bench scenarios) on a
  terminal, and prints one plain line per step elsewhere (CI logs, pipes), as the commands always did.
- ``ProgressLine`` is one status line of free text (which forward, which layer is running), redrawn in place on a
  terminal and silent elsewhere.

This module imports nothing from syncfree, so every layer (the auditor included) may use it.
"""

from __future__ import annotations

import contextlib
import sys
from io import StringIO
from typing import Callable, Iterator, Sequence, TextIO

from rich import box
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

__all__ = ["text_table", "step_progress", "ProgressLine"]

# SIMPLE_HEAD in ASCII: no edges, no column lines, a rule of "-" under the header. ASCII so that a table prints
# to any stream, whatever its encoding (a log file on Windows, PYTHONIOENCODING=ascii).
_RULE_UNDER_HEADER = box.Box(
    "    \n"
    "    \n"
    " -- \n"
    "    \n"
    "    \n"
    "    \n"
    "    \n"
    "    \n",
    ascii=True,
)
_WIDE = 100_000  # wide enough that no table is ever wrapped or cut


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def text_table(head: Sequence[str] | None, rows: Sequence[Sequence[str]], align: str = "") -> str:
    """``rows`` under ``head`` as plain text, columns two spaces apart, each line right-stripped.

    ``align`` has one letter per column, ``l`` (left) or ``r`` (right); by default the first column is
    left-aligned and the others right-aligned. ``head=None`` draws the rows alone, without a header or rule.
    Cells are taken literally: no markup, no highlighting, no emoji codes.
    """
    columns = len(head) if head is not None else max((len(r) for r in rows), default=0)
    align = align or "l" + "r" * (columns - 1)
    if len(align) != columns or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r}: one letter per column (l or r), for {columns} columns")
    table = Table(box=_RULE_UNDER_HEADER, show_header=head is not None, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0), highlight=False, expand=False)
    for i, side in enumerate(align):
        # (overflow "fold" never cuts at this width; "ignore" would drop the right-justification)
        table.add_column(Text(head[i]) if head is not None else None, justify="right" if side == "r" else "left",
                         no_wrap=True, overflow="fold")
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    console = Console(file=StringIO(), width=_WIDE, color_system=None, force_terminal=False, force_jupyter=False,
                      force_interactive=False, markup=False, highlight=False, emoji=False, legacy_windows=False)
    console.print(table)
    lines = [line.rstrip() for line in console.file.getvalue().splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


@contextlib.contextmanager
def step_progress(total: int, stream: TextIO | None = None, plain: TextIO | None = None,
                  indent: str = "") -> Iterator[Callable[[str], None]]:
    """Yield ``step(text)``, to be called as each of ``total`` steps starts.

    On a terminal ``stream`` (stderr by default), a bar with the elapsed time and the current step's text, left
    on screen at the end. Elsewhere nothing goes to ``stream``: each step is one plain line, ``indent + text``,
    on ``plain`` (stdout by default), flushed at once, so logs show how far a run got.
    """
    stream = sys.stderr if stream is None else stream
    if not _is_terminal(stream):
        out = sys.stdout if plain is None else plain

        def line(text: str) -> None:
            print(indent + text, file=out, flush=True)

        yield line
        return
    console = Console(file=stream, highlight=False, markup=False, emoji=False)
    # stderr written while the bar is up (a warning) is printed above it; stdout is left alone: it may be a file.
    # (finished in plain green: rich's own olive turns grey on a 16-colour terminal, like an empty bar)
    progress = Progress(BarColumn(finished_style="green"), TimeElapsedColumn(),
                        TextColumn("{task.description}", markup=False), console=console, redirect_stdout=False,
                        redirect_stderr=stream is sys.stderr)
    task = progress.add_task("", total=max(total, 1))
    started = 0

    def step(text: str) -> None:
        nonlocal started
        progress.update(task, completed=started, description=text)
        started += 1

    with progress:
        yield step
        progress.update(task, completed=started)  # (not reached when the work raised: the bar stays where it was)


class ProgressLine:
    """One status line on ``stream`` (stderr by default), redrawn in place; silent unless it is a terminal.

    ``show(text)`` replaces the line's text; ``clear()`` erases it, so what is printed next starts on a clean line.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_terminal(self.stream)
        self._live: Live | None = None

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        line = Text(text, no_wrap=True, overflow="ellipsis")
        if self._live is None:
            console = Console(file=self.stream, highlight=False, markup=False, emoji=False)
            self._live = Live(line, console=console, auto_refresh=False, transient=True, redirect_stdout=False,
                              redirect_stderr=False)
            self._live.start(refresh=True)
        else:
            self._live.update(line, refresh=True)

    def clear(self) -> None:
        """Erase the line, so what is printed next starts on a clean one."""
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()
