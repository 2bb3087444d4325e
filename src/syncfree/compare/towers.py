"""How a vision tower is called alone, as its model's own ``get_*_features`` calls it (``syncfree audit --scope vision``,
``syncfree bench``'s vision cells)."""

from __future__ import annotations

import importlib

import torch

from ..plan.spec import layout_of

__all__ = ["tower_call"]


def tower_call(model, kind: str, pixels: torch.Tensor, grid: torch.Tensor, plan, images_per_sample=None) -> tuple:
    """The pixels and grid the vision tower is handed for ``kind``, as the model's own get_*_features hands them,
    and the plan for them: where the tower sees each video frame as a (1, h, w) row (GLM-4.1V), those rows (stock:
    made from the device grid, with stock's reads; patched: the plan's host rows); a tower that takes
    (1, patches, C, P, P) pixels (PaddleOCR-VL) gets them so; where the grid also holds the images to generate
    (GLM-Image: ``images_per_sample`` splits it), the sources' rows (stock: by its own method, from the device grid)."""
    model_type = model.config.model_type  # (a tower alone carries its sub-config's type: "paddleocr_vl_vision")
    layout = layout_of(model_type) or layout_of(model_type.removesuffix("_vision"))
    pixels = pixels.to(model.dtype)
    if layout is not None and layout.tower.pixels_4d:
        pixels = pixels.unsqueeze(0)
    if plan is not None:
        vp = plan.video_frames if kind == "video" and plan.video_frames is not None else getattr(plan, kind)
        return pixels, vp.grid_thw, {"syncfree_vision_plan": vp}
    if layout is not None and layout.plan.tower_grid is not None:  # (the tower sees the sources: stock's own split)
        model_class = getattr(importlib.import_module(layout.modeling), layout.rope.host_class)
        return pixels, model_class.get_image_grids_for_generation(None, images_per_sample, grid), {}
    if kind == "video" and layout is not None and layout.video.frames_as_images:
        rows = torch.repeat_interleave(grid[:, 1:], grid[:, 0], dim=0)
        return pixels, torch.cat([torch.ones_like(rows[:, :1]), rows], dim=1), {}
    return pixels, grid, {}
