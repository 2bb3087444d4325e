"""``patch(model, vision_every_step=True)``: every training forward runs the vision tower for images and
for videos, so data-parallel ranks stay in step whatever their micro-batches hold.

Why: FSDP2 all-gathers each vision block's parameters when the block runs and reduce-scatters its
gradients in backward, on every rank together. A rank whose micro-batch has no image (or no video)
skips a tower pass the others make, and the ranks' collectives stop matching (gloo: "Received data
size doesn't match expected size"); DDP without ``find_unused_parameters`` fails a step later. The
usual workaround runs a fake image through the whole model. Here the missing pass is made on the
smallest input the tower takes (one merge unit: ``merge_size**2`` patches of zeros, a host grid, so
no sync), and its outputs enter the text model's input embeddings multiplied by zero: every rank makes
two tower passes per forward, gradients reach every vision parameter (zeros from the dummy), and the
numbers are those of the run without it (``x + 0 == x``).

Only in training (``model.training`` and grad mode on); inference is untouched.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree

__all__ = ["ATTRIBUTE", "vision_in_step"]

ATTRIBUTE = "_syncfree_vision_every_step"
_PASSES = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def _dummy_pass(model, visual) -> torch.Tensor:
    """Zero, as a scalar that depends on every output of one tower pass over one merge unit of zeros."""
    config = visual.config
    merge = config.spatial_merge_size
    # (a tower without temporal patches, whose config names no temporal_patch_size, embeds one frame per patch)
    width = config.in_channels * getattr(config, "temporal_patch_size", 1) * config.patch_size ** 2
    weight = next(visual.parameters())
    pixels = torch.zeros(merge * merge, width, dtype=weight.dtype, device=weight.device)
    grid = torch.tensor([[1, merge, merge]])  # on the host: the patched tower plans it without a read
    out = visual(pixels, grid_thw=grid)
    leaves = [t for t in pytree.tree_leaves(out.to_tuple() if hasattr(out, "to_tuple") else out)
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(t.sum() for t in leaves) * 0


@contextlib.contextmanager
def vision_in_step(model, given: dict):
    """While one ``*Model.forward`` runs: make the tower passes its inputs do not (see the module doc)."""
    if not (model.__dict__.get(ATTRIBUTE) and model.training and torch.is_grad_enabled()):
        yield
        return
    missing = sum(given.get(pixels) is None for pixels, _ in _PASSES)
    if not missing:
        yield
        return

    def add_zero(module, args, kwargs):
        zero = sum(_dummy_pass(model, model.visual) for _ in range(missing))
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise ValueError("syncfree.patch(vision_every_step=True) expects the text model to be called with "
                             "inputs_embeds, as the stock forward does")
        kwargs["inputs_embeds"] = embeds + zero.to(embeds.dtype)
        return args, kwargs

    handle = model.language_model.register_forward_pre_hook(add_zero, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
