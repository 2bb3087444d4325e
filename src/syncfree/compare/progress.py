"""A one-line progress display for long forwards, and the module hooks that drive it.

A full-size audited forward on the emulated device runs for a minute or more; without a
sign of life a user cannot tell a slow run from a hung one. ``ProgressLine`` (drawn by
``syncfree.display``, with rich) redraws one terminal line in place and prints nothing at
all when its stream is not a terminal, so logs and pipes stay clean. ``layer_progress``
reports each vision block and text decoder layer as it starts, through forward pre-hooks
that are removed afterwards. The hooks run plain Python (no tensor is touched), so they add no sync and no copy.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from ..display import ProgressLine

__all__ = ["ProgressLine", "layer_progress"]

# Which ModuleLists are worth counting, by their attribute name: the vision towers' transformer
# blocks (every Qwen-VL family calls them `blocks`) and the text model's decoder `layers`.
_KINDS = {"blocks": "vision block", "layers": "text layer"}


@contextlib.contextmanager
def layer_progress(model: torch.nn.Module, label: str, show: Callable[[str], None] | None) -> Iterator[None]:
    """While inside, call ``show(f"{label} vision block 3/24")`` as each block or decoder layer starts.

    ``show=None`` registers nothing. ``label`` alone is shown on entry (a rope-index forward has no layers).
    """
    if show is None:
        yield
        return
    handles = []
    for name, module in model.named_modules():
        kind = _KINDS.get(name.rsplit(".", 1)[-1])
        if kind is None or not isinstance(module, torch.nn.ModuleList) or not len(module):
            continue
        for i, layer in enumerate(module):
            text = f"{label} {kind} {i + 1}/{len(module)}"
            handles.append(layer.register_forward_pre_hook(lambda _m, _args, text=text: show(text)))
    show(label)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
