"""The audit report: events grouped by source line, as a table or JSON."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field

from .events import D2H, H2D, SYNC, Collector, Event
from .phases import PHASES

__all__ = ["Report", "LineSummary"]


@dataclass
class LineSummary:
    """Everything that happened at one source line."""

    line: str
    code: str
    function: str
    phase: str = "forward"
    syncs: int = 0
    h2d: int = 0
    d2h: int = 0
    blocking_copies: int = 0
    nbytes: int = 0
    ops: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def add(self, e: Event) -> None:
        self.syncs += int(e.waits)
        self.h2d += int(e.kind == H2D)
        self.d2h += int(e.kind == D2H)
        self.blocking_copies += int(e.kind != SYNC and e.blocking)
        self.nbytes += e.nbytes
        label = e.op if not e.api or e.api == e.op else f"{e.api} -> {e.op}"
        if label not in self.ops:
            self.ops.append(label)
        if e.reason not in self.reasons:
            self.reasons.append(e.reason)


class Report(Collector):
    """What one ``audit()`` saw. ``events`` in order; ``syncs`` and ``copies`` are views of them."""

    def __init__(self, engine: str) -> None:
        super().__init__()
        self.engine = engine

    @property
    def syncs(self) -> list[Event]:
        """Events where the host waited for the device (syncs, and blocking copies to the host)."""
        return [e for e in self.events if e.waits]

    @property
    def copies(self) -> list[Event]:
        """Host-to-device and device-to-host copies, blocking or not."""
        return [e for e in self.events if e.kind in (H2D, D2H)]

    @property
    def blocking_copies(self) -> list[Event]:
        return [e for e in self.copies if e.blocking]

    def by_line(self) -> "OrderedDict[str, LineSummary]":
        """Events grouped by phase and source line, in the order they first occurred.

        Keyed by ``file:line``, with `` [phase]`` appended for every phase but the forward (a line
        can sync in the forward and again in its backward or recompute).
        """
        lines: OrderedDict[str, LineSummary] = OrderedDict()
        for e in self.events:
            w = e.where
            key = e.line if e.phase == "forward" else f"{e.line} [{e.phase}]"
            summary = lines.get(key)
            if summary is None:
                summary = lines[key] = LineSummary(e.line, w.code if w else "", w.function if w else "", e.phase)
            summary.add(e)
        return lines

    @property
    def phases(self) -> list[str]:
        """The phases of a training step this report saw events in, in step order."""
        seen = {e.phase for e in self.events}
        return [p for p in PHASES if p in seen]

    def by_phase(self) -> dict[str, dict[str, int]]:
        """Syncs and blocking copies per phase, every phase listed (zeros included)."""
        return {p: {"syncs": sum(e.waits for e in self.events if e.phase == p),
                    "blocking_copies": sum(e.kind != SYNC and e.blocking for e in self.events if e.phase == p)}
                for p in PHASES}

    def summary(self) -> dict:
        return {
            "engine": self.engine,
            "syncs": len(self.syncs),
            "h2d": sum(e.kind == H2D for e in self.events),
            "d2h": sum(e.kind == D2H for e in self.events),
            "blocking_copies": len(self.blocking_copies),
            "lines": len(self.by_line()),
            "launches": self.launches if self.engine == "emulated" else None,
        }

    def table(self, max_code: int = 60) -> str:
        """A plain-text table: one row per source line with its syncs and copies."""
        from ..display import text_table  # (rich, imported when a table is drawn, not with the auditor)

        # The phase column appears once anything happened outside a forward (a training step).
        phased = self.phases not in ([], ["forward"])
        head = ("syncs", "h2d", "d2h", "blk", *(("phase",) if phased else ()), "where", "what", "code")
        rows = []
        for s in self.by_line().values():
            code = s.code if len(s.code) <= max_code else s.code[: max_code - 3] + "..."
            rows.append((str(s.syncs), str(s.h2d), str(s.d2h), str(s.blocking_copies),
                         *((s.phase,) if phased else ()), f"{s.line} {s.function}", ", ".join(s.ops), code))
        t = self.summary()
        out = [text_table(head, rows, align="rrrr" + "l" * (len(head) - 4))]  # the counts right-aligned
        launches = f"; {t['launches']} kernel launches" if t["launches"] is not None else ""
        out.append(
            f"total ({t['engine']}): {t['syncs']} syncs, {t['h2d']} host-to-device and {t['d2h']} "
            f"device-to-host copies ({t['blocking_copies']} blocking), from {t['lines']} source lines{launches}"
        )
        if phased:
            out.append("by phase: " + ", ".join(f"{p} {n['syncs']} syncs/{n['blocking_copies']} blocking copies"
                                                 for p, n in self.by_phase().items()))
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {
            "summary": self.summary(),
            "phases": self.by_phase(),
            "lines": [vars(s) for s in self.by_line().values()],
            "launch_ops": dict(sorted(self.launch_ops.items(), key=lambda kv: -kv[1])),
            "events": [e.to_dict() for e in self.events],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __repr__(self) -> str:
        t = self.summary()
        return f"<Report {t['engine']}: {t['syncs']} syncs, {t['blocking_copies']} blocking copies>"
