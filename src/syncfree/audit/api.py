"""The auditor's public verbs: ``audit()`` and ``assert_no_sync()``."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from .cuda_engine import CudaEngine, CudaUnavailable
from .emulate import emulate_cuda, is_emulating
from .report import Report

__all__ = ["audit", "assert_no_sync", "SyncError"]

_ENGINES = ("auto", "emulated", "cuda")


class SyncError(AssertionError):
    """Raised by ``assert_no_sync`` with the offending source lines; ``report`` holds everything seen."""

    def __init__(self, message: str, report: Report) -> None:
        super().__init__(message)
        self.report = report


def _choose(engine: str) -> str:
    if engine not in _ENGINES:
        raise ValueError(f"engine must be one of {', '.join(_ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    if is_emulating():  # first: torch.cuda.is_available() answers True for the emulated device too
        return "emulated"
    if torch.cuda.is_available():
        return "cuda"
    raise CudaUnavailable(
        "syncfree.audit() found no CUDA device and no emulated one. On a CPU-only machine, run the "
        "model inside `with syncfree.emulate_cuda():` (put model and inputs on 'cuda' there), or pass "
        "engine='emulated'."
    )


@contextlib.contextmanager
def audit(engine: str = "auto") -> Iterator[Report]:
    """Record every host sync and host/device copy made inside the block, by source line.

    ``engine="auto"`` uses the emulated device inside ``emulate_cuda()`` and the real
    device where CUDA is available; ``"emulated"`` enters ``emulate_cuda()`` itself.

        with syncfree.audit() as report:
            model(**inputs)
        print(report.table())
    """
    chosen = _choose(engine)
    report = Report(chosen)
    if chosen == "cuda":
        engine_ = CudaEngine(report)
        engine_.start()
        try:
            yield report
        finally:
            engine_.stop()
        return
    with emulate_cuda():
        report.start()
        try:
            yield report
        finally:
            report.stop()


@contextlib.contextmanager
def assert_no_sync(max_syncs: int = 0, max_blocking_copies: int = 0, engine: str = "auto") -> Iterator[Report]:
    """Fail (``SyncError``, an ``AssertionError``) if the block syncs or makes blocking copies.

    The message lists every offending source line with what happened there. The
    limits allow a known number, e.g. ``max_syncs=1`` for one explicit metadata read.
    """
    with audit(engine) as report:
        yield report
    syncs, blocking = report.syncs, report.blocking_copies
    if len(syncs) <= max_syncs and len(blocking) <= max_blocking_copies:
        return
    offending = Report(report.engine)
    offending.events = [e for e in report.events if e.waits or (e.kind != "sync" and e.blocking)]
    raise SyncError(
        f"expected at most {max_syncs} host syncs and {max_blocking_copies} blocking copies, got "
        f"{len(syncs)} syncs and {len(blocking)} blocking copies:\n{offending.table()}",
        report,
    )
