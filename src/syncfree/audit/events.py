"""What the auditor records: one ``Event`` per host sync or host/device copy.

Both engines (emulated and real CUDA) produce the same ``Event`` records, so a
report from a CPU-only machine can be compared line by line with one from a GPU.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
import threading
import warnings
from dataclasses import asdict, dataclass, field

import torch

__all__ = ["Event", "Frame", "Collector", "capture_stack", "active_collectors", "is_machinery"]

SYNC, H2D, D2H = "sync", "h2d", "d2h"

# Frames inside these folders are machinery, not the code a user wants to see.
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_SYNCFREE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SKIP_PREFIXES = (_TORCH_DIR, _SYNCFREE_DIR)
_SKIP_FILES = ("contextlib.py", "<frozen", "<string>")
# The real-CUDA engine hears of a sync through a warning: Python's own warnings code then sits
# between the syncing call and the handler.
_WARNINGS_FILE = warnings.__file__
_MAX_CHAIN = 16


@dataclass(frozen=True)
class Frame:
    """One Python source line: a file, a line number, and the function it is in."""

    filename: str
    lineno: int
    function: str

    @property
    def short(self) -> str:
        """The file path from its package root on (``transformers/models/...``)."""
        parts = self.filename.replace("\\", "/").split("/")
        for anchor in ("site-packages", "dist-packages", "src"):
            if anchor in parts:
                return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor) + 1 :])
        return "/".join(parts[-3:])

    @property
    def code(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()

    def __str__(self) -> str:
        return f"{self.short}:{self.lineno} ({self.function})"


# syncfree's one deliberate sync (the read when prepare() was skipped) is shown where it happens.
_KEEP = os.path.join(_SYNCFREE_DIR, "rewrite", "host_read.py")


def _tail(*parts: str) -> str:
    return os.sep + os.path.join(*parts)


# Transformers' decorators (can_return_tuple, merge_with_config_defaults, check_model_inputs in
# utils/generic.py; capture_outputs in utils/output_capturing.py; deprecate_kwarg in utils/deprecation.py)
# put a `wrapper` frame between every model forward and its caller. They only pass arguments
# along, so a sync "in" one belongs to the model line around it. Same in 5.17 and the newest release.
_WRAPPER_FILES = (_tail("transformers", "utils", "generic.py"), _tail("transformers", "utils", "output_capturing.py"),
                  _tail("transformers", "utils", "deprecation.py"))
# Wrapper functions inside modules that also hold real model code: skipped by (file, function).
_WRAPPER_FUNCTIONS = {
    (_tail("transformers", "modeling_layers.py"), "forward_with_checkpointing"),  # GradientCheckpointingLayer
    (_tail("transformers", "modeling_rope_utils.py"), "wrapper"),  # dynamic_rope_update
}
# A console script (`syncfree`, `pytest`, ...) is a few lines that call the entry point: its
# `<module>` frame is where an event ends up when everything between is machinery.
_SCRIPT_DIRS = {os.path.abspath(d) for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)) if d}


@functools.lru_cache(maxsize=4096)
def is_machinery(filename: str, function: str = "") -> bool:
    if filename == _KEEP:
        return False
    if (filename.startswith(_SKIP_PREFIXES) or filename == _WARNINGS_FILE
            or any(s in filename for s in _SKIP_FILES)):
        return True
    if filename.endswith(_WRAPPER_FILES):
        return True
    if any(filename.endswith(tail) and function == name for tail, name in _WRAPPER_FUNCTIONS):
        return True
    return function == "<module>" and os.path.dirname(os.path.abspath(filename)) in _SCRIPT_DIRS


def capture_stack(skip_machinery: bool = True) -> tuple[Frame, ...]:
    """The caller chain, innermost first, without machinery: frames from torch and syncfree,
    Transformers' pass-through decorator wrappers, and a console script's entry line."""
    frames: list[Frame] = []
    f = sys._getframe(1)
    while f is not None and len(frames) < _MAX_CHAIN:
        code = f.f_code
        if not (skip_machinery and is_machinery(code.co_filename, code.co_name)):
            frames.append(Frame(code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    return tuple(frames)


@dataclass
class Event:
    """A host sync or a host/device copy, and the source line that caused it.

    ``kind`` is ``"sync"`` (the host reads device data and waits for it), ``"h2d"``
    or ``"d2h"`` (a copy). ``phase`` is the part of a training step it happened in
    (``forward``, ``recompute``, ``backward``, ``optimizer``; see ``phases.py``); a backward
    event's ``stack`` is the forward line that created the autograd node. ``waits`` is true whenever the host waits for the
    device: every sync, and every copy to the host that is not a non-blocking
    copy into pinned memory. ``blocking`` applies to copies.
    """

    kind: str
    op: str
    reason: str
    api: str | None = None
    shapes: tuple = ()
    nbytes: int = 0
    blocking: bool = True
    pinned: bool | None = None
    waits: bool = True
    engine: str = "emulated"
    stack: tuple[Frame, ...] = field(default_factory=tuple)
    phase: str = "forward"

    @property
    def where(self) -> Frame | None:
        """The innermost source line outside torch and syncfree."""
        return self.stack[0] if self.stack else None

    @property
    def line(self) -> str:
        """``file:line`` of ``where``, the key reports group by."""
        w = self.where
        return f"{w.short}:{w.lineno}" if w else "<unknown>"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shapes"] = [list(s) for s in self.shapes]
        d["where"] = str(self.where) if self.where else None
        d["line"] = self.line
        d["code"] = self.where.code if self.where else ""
        d["stack"] = [str(f) for f in self.stack]
        return d


class Collector:
    """Receives the events of the thread that started it, while active (``start`` .. ``stop``)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.launches = 0  # kernels the forward would launch on CUDA (emulated device only)
        self.launch_ops: dict[str, int] = {}

    def start(self) -> None:
        active_collectors().append(self)

    def stop(self) -> None:
        collectors = active_collectors()
        if self in collectors:
            collectors.remove(self)

    def add(self, event: Event) -> None:
        self.events.append(event)

    def add_launch(self, op: str) -> None:
        self.launches += 1
        self.launch_ops[op] = self.launch_ops.get(op, 0) + 1


_local = threading.local()


def active_collectors() -> list[Collector]:
    """The collectors started on this thread (an audit hears only its own thread's work)."""
    collectors = getattr(_local, "collectors", None)
    if collectors is None:
        collectors = _local.collectors = []
    return collectors
