"""What the client examples share: a small image-and-text chat dataset, and a Trainer callback that audits every
training step and says whose each sync is.

A sync's owner is told from the source line that made it (``Event.line``, the innermost frame outside torch):

* ``model``: the model's forward and backward (``transformers/models/``, Transformers' masking and rotary code);
* ``syncfree``: syncfree's own deliberate read when a forward has no plan (``syncfree/rewrite/host_read.py``);
* ``generate``: Transformers' generation loop (``transformers/generation/``): stopping checks, the loop's bookkeeping;
* ``trainer``: Transformers' ``Trainer`` (its logging, its NaN/Inf filter of the loss);
* ``trl``, ``peft``, ``accelerate``, ``liger_kernel``: the client's own code;
* ``other``: anything else (the example itself).
"""

from __future__ import annotations

import contextlib

import numpy as np
from transformers import TrainerCallback

import syncfree

__all__ = ["owner", "owners", "SyncsPerStep", "random_image", "chat_dataset", "QUESTIONS", "ANSWERS",
           "trl_torch_kernels"]

_CLIENTS = ("trl", "peft", "accelerate", "liger_kernel")


def owner(line: str) -> str:
    """Who made the sync at ``line`` (``file:lineno`` from the package root, as ``Event.line`` gives it)."""
    path = line.split(":")[0]
    package = path.split("/")[0]
    if package == "syncfree":
        return "syncfree"
    if package in _CLIENTS:
        return package
    if path.startswith("transformers/generation/"):
        return "generate"
    if path.startswith("transformers/trainer"):
        return "trainer"
    if package == "transformers":
        return "model"
    return "other"


def owners(report) -> dict[str, int]:
    """The report's syncs counted by owner (only owners with syncs)."""
    counts: dict[str, int] = {}
    for event in report.syncs:
        who = owner(event.line)
        counts[who] = counts.get(who, 0) + 1
    return counts


class SyncsPerStep(TrainerCallback):
    """Audits each training step, from its start to the next one's (data, forward, backward, optimizer, and the
    trainer's work after it: logging, a GRPO trainer's generation for the next batches), and keeps, per step, the
    syncs by owner and by phase and the lines that made them. Use it inside ``syncfree.emulate_cuda()``."""

    def __init__(self, verbose: bool = True):
        self.verbose = verbose
        self.steps: list[dict] = []
        self._audit = self._report = None

    def _close(self, step: int) -> None:
        if self._audit is None:
            return
        self._audit.__exit__(None, None, None)
        report, self._audit = self._report, None
        lines: dict[str, int] = {}
        for event in report.syncs:
            key = f"{event.line} ({event.where.function if event.where else '?'})"
            lines[key] = lines.get(key, 0) + 1
        entry = {"step": step, "syncs": len(report.syncs), "owners": owners(report),
                 "phases": {p: n["syncs"] for p, n in report.by_phase().items()}, "lines": lines}
        self.steps.append(entry)
        if self.verbose:
            print(f"step {step}: {entry['syncs']} syncs, by owner {entry['owners']}")
            for line, n in sorted(lines.items()):
                print(f"    {n:3d}  {owner(line):10s} {line}")

    def on_step_begin(self, args, state, control, **kwargs):
        self._close(state.global_step)
        self._audit = syncfree.audit()
        self._report = self._audit.__enter__()

    def on_train_end(self, args, state, control, **kwargs):
        self._close(state.global_step)


@contextlib.contextmanager
def trl_torch_kernels():
    """TRL's PyTorch path for its fused log-prob and entropy kernels, while the block runs.

    Where Triton is installed (Liger-Kernel brings it), TRL runs Triton kernels on every ``cuda`` tensor, and on the
    emulated device there is no GPU to run them (Triton fails looking for ``libcuda.so``). TRL's PyTorch tiles compute
    the same values; on a real GPU leave this out."""
    import trl.trainer.utils as trl_utils
    from trl.kernels import chunked_logprob

    saved = chunked_logprob._TRITON_AVAILABLE, trl_utils.is_triton_available
    chunked_logprob._TRITON_AVAILABLE, trl_utils.is_triton_available = False, lambda: False
    try:
        yield
    finally:
        chunked_logprob._TRITON_AVAILABLE, trl_utils.is_triton_available = saved


def random_image(height: int, width: int, seed: int):
    """An RGB image of random pixels (PIL), ``height`` x ``width``."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


QUESTIONS = ("what is in the image", "describe the picture", "what color is the sky", "is there a cat")
ANSWERS = ("a dog and a tree", "a red car on the left", "blue", "yes there is one cat")


def chat_dataset(unit: int, n: int = 8, *, with_answers: bool = True, text_only_every: int = 4):
    """``n`` chats about random images of a few sizes (multiples of ``unit`` pixels, the model's patch x merge), as
    TRL's vision datasets hold them: ``{"images": [image], "messages": [user, assistant]}`` with answers, or
    ``{"images": [image], "prompt": [user]}`` without (for GRPO). Every ``text_only_every``-th chat has no image
    (0: all have one; TRL's GRPO processes a batch's images together and takes no batch with a text-only row)."""
    from datasets import Dataset

    sizes = ((2, 2), (2, 3), (3, 2), (4, 4))
    rows = []
    for i in range(n):
        h, w = sizes[i % len(sizes)]
        has_image = not text_only_every or i % text_only_every != text_only_every - 1
        user = {"role": "user", "content": ([{"type": "image"}] if has_image else [])
                + [{"type": "text", "text": QUESTIONS[i % len(QUESTIONS)]}]}
        images = [random_image(h * unit, w * unit, seed=i)] if has_image else []
        if with_answers:
            answer = {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[i % len(ANSWERS)]}]}
            rows.append({"images": images, "messages": [user, answer]})
        else:
            rows.append({"images": images, "prompt": [user]})
    return Dataset.from_list(rows)
