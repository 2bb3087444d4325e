"""Where the commands write when ``--out`` names no folder: the temp folder, so running a command (reproducing a
recorded table included) never overwrites the checkout's tracked results (``benchmarks/results``)."""

from __future__ import annotations

import os
import tempfile

__all__ = ["bench_out", "census_out"]


def bench_out(quick: bool) -> str:
    """``syncfree bench``'s folder: a full run's, or ``--quick``'s (a smoke run)."""
    return os.path.join(tempfile.gettempdir(), "syncfree-bench" if quick else "syncfree-bench-results")


def census_out() -> str:
    """``syncfree census``'s folder."""
    return os.path.join(tempfile.gettempdir(), "syncfree-census")
