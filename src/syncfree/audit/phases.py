"""Which phase of a training step an event belongs to, and the forward line a backward op came from.

A training step has five phases, told apart from the state of the thread when an event is recorded:

* ``optimizer``: a frame of ``torch.optim`` (``step``, schedulers) or of gradient clipping is running;
* ``recompute``: gradient checkpointing is re-running a forward during backward: non-reentrant
  checkpointing does it from the saved-tensor unpack hook (``recompute_fn``), reentrant checkpointing
  from ``CheckpointFunction.backward``, while that function's own autograd node is the one executing;
* ``backward``: any other work while the autograd engine executes a node on this thread;
* ``trainer``: a trainer's own work outside the model, the backward and the optimizer (a frame of Transformers'
  ``Trainer`` or of TRL's trainers is running, and no module's forward nor ``generate()`` is: its per-step loss
  checks, its logging);
* ``forward``: everything else.

Backward ops run from the engine, so the Python stack at that moment names only the ``.backward()``
call. The line that matters is the forward line that created the node: autograd's anomaly mode stores
that stack in each node's metadata when the node is made (``emulate_cuda()`` turns it on, without its
NaN checks, which would sync). ``forward_frames`` reads it back.
"""

from __future__ import annotations

import os
import re
import sys

import torch

from .events import Frame, capture_stack, is_machinery

__all__ = ["PHASES", "current_phase", "forward_frames", "locate"]

PHASES = ("forward", "recompute", "backward", "optimizer", "trainer")

_TORCH_DIR = os.path.dirname(torch.__file__)
_OPTIM_DIR = os.path.join(_TORCH_DIR, "optim") + os.sep
_CLIP_FILE = os.path.join(_TORCH_DIR, "nn", "utils", "clip_grad.py")
_CHECKPOINT_FILE = os.path.join(_TORCH_DIR, "utils", "checkpoint.py")
_RECOMPUTE_FUNCTIONS = ("recompute_fn", "unpack_hook")
_REENTRANT_NODE = "CheckpointFunctionBackward"
_MODULE_FILE = os.path.join(_TORCH_DIR, "nn", "modules", "module.py")
_GENERATION_DIR = os.sep + os.path.join("transformers", "generation") + os.sep  # (generate(): the model's work)
# A trainer's own frames: Transformers' Trainer (transformers/trainer.py) and TRL's trainers (trl/trainer/).
_TRAINER_FILES = (os.sep + os.path.join("transformers", "trainer.py"),)
_TRAINER_DIRS = (os.sep + os.path.join("trl", "trainer") + os.sep,)
_FRAME_LINE = re.compile(r'File "(?P<file>.+)", line (?P<line>\d+), in (?P<function>.+)')


def current_phase() -> str:
    """The phase of the work running on this thread now (one of ``PHASES``)."""
    node = torch._C._current_autograd_node()
    f = sys._getframe(1)
    recompute = in_module = in_trainer = False
    while f is not None:
        filename = f.f_code.co_filename
        if filename.startswith(_OPTIM_DIR) or filename == _CLIP_FILE:
            return "optimizer"
        if filename == _CHECKPOINT_FILE and f.f_code.co_name in _RECOMPUTE_FUNCTIONS:
            recompute = True
        elif filename == _MODULE_FILE or _GENERATION_DIR in filename:
            in_module = True
        elif filename.endswith(_TRAINER_FILES) or any(d in filename for d in _TRAINER_DIRS):
            in_trainer = True
        f = f.f_back
    if node is None:
        return "trainer" if in_trainer and not in_module else "forward"
    if recompute or node.name() == _REENTRANT_NODE:
        return "recompute"
    return "backward"


def forward_frames() -> tuple[Frame, ...]:
    """The forward stack (innermost first, machinery left out) of the autograd node executing on this
    thread, as anomaly mode recorded it; empty when there is none or it was made without anomaly mode."""
    node = torch._C._current_autograd_node()
    if node is None:
        return ()
    lines = node.metadata.get("traceback_") or ()
    frames = []
    for entry in reversed(lines):  # format_stack lists the outermost frame first
        m = _FRAME_LINE.search(entry)
        if m is None:
            continue
        filename, function = m["file"], m["function"].strip()
        if not is_machinery(filename, function):
            frames.append(Frame(filename, int(m["line"]), function))
    return tuple(frames)


def locate() -> tuple[str, tuple[Frame, ...]]:
    """The phase now and the stack an event made now belongs to (for backward: the forward line)."""
    phase = current_phase()
    if phase == "backward":
        frames = forward_frames()
        if frames:
            return phase, frames
    return phase, capture_stack()
