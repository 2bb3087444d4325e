"""The checks ``syncfree.prepare`` runs on a processor batch before planning it (all on the host).

The patched forward itself checks only what stock checks, with stock's words, so that code and
tests written against stock behave the same. ``prepare()`` is syncfree's own API and can afford
to look closer, because everything is still on the host: where stock would raise, it raises with
stock's message (and detail after it); where stock would silently build wrong 3D positions
(placeholder runs that do not match the grids), it says so.
"""

from __future__ import annotations

import torch

from .plan import ModelSpec, placeholder_runs, vision_plan

__all__ = ["check_batch"]

_KIND = {1: "image", 2: "video"}


def _check_tokens(spec: ModelSpec, input_ids, mm_token_type_ids, attention_mask) -> torch.Tensor:
    ids, types = input_ids, mm_token_type_ids
    for name, t in (("input_ids", ids), ("mm_token_type_ids", types)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 2):
            raise ValueError(f"{name} must be a tensor of shape (batch, sequence), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if ids is None and types is None:
        raise ValueError("syncfree.prepare needs input_ids (or mm_token_type_ids) to plan the forward")
    if ids is not None and types is not None:
        if ids.shape != types.shape:
            raise ValueError(f"input_ids {tuple(ids.shape)} and mm_token_type_ids {tuple(types.shape)} must have the "
                             "same shape")
        for kind, token in ((1, spec.image_token_id), (2, spec.video_token_id)):
            marked, found = int((types == kind).sum()), int((ids == token).sum())
            if not torch.equal(types == kind, ids == token):
                raise ValueError(
                    f"mm_token_type_ids marks {marked} tokens as {_KIND[kind]} placeholders but input_ids holds "
                    f"{found} token {token} (the {_KIND[kind]}_token_id syncfree assumed); pass the model or its "
                    "config as syncfree.prepare(batch, device, model)")
    reference = ids if ids is not None else types
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 and \
            attention_mask.shape != reference.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match the tokens "
                         f"{tuple(reference.shape)}")
    if ids is not None:
        return (ids == spec.image_token_id).long() + 2 * (ids == spec.video_token_id).long()
    return types.to(torch.long)


def check_batch(spec: ModelSpec, *, input_ids=None, mm_token_type_ids=None, attention_mask=None, image_grid_thw=None,
                video_grid_thw=None, second_per_grid_ts=None, pixel_values=None, pixel_values_videos=None) -> None:
    """Raise ``ValueError`` naming the first inconsistency between tokens, grids and pixels."""
    types = _check_tokens(spec, input_ids, mm_token_type_ids, attention_mask)
    merge2 = spec.spatial_merge_size ** 2
    for kind, name, grid, pixels in ((1, "image", image_grid_thw, pixel_values),
                                     (2, "video", video_grid_thw, pixel_values_videos)):
        tokens = int((types == kind).sum())
        if grid is None:
            if pixels is not None:
                raise ValueError(f"{'pixel_values' if kind == 1 else 'pixel_values_videos'} given without "
                                 f"{name}_grid_thw")
            continue
        vp = vision_plan(grid, spec, f"{name}_grid_thw")
        features = sum(vp.split_sizes)
        if tokens != features:  # stock's words (get_placeholder_mask), then what it means
            raise ValueError(f"{name.capitalize()} features and {name} tokens do not match, tokens: {tokens}, "
                             f"features: {features} ({name}_grid_thw describes {len(vp.split_sizes)} {name}s of "
                             f"{list(vp.split_sizes)} tokens)")
        runs = [n for row in types for n in placeholder_runs(row, kind)]
        if kind == 2 and spec.split_video_frames:  # Qwen3-VL: each frame between its own start/end tokens
            expected = [h * w // merge2 for t, h, w in vp.grid_thw.tolist() for _ in range(t)]
            unit = "video frame"
        else:
            expected, unit = list(vp.split_sizes), name
        if runs != expected:
            raise ValueError(f"the {name} placeholder runs in the tokens have {runs} tokens but {name}_grid_thw "
                             f"needs one run per {unit} of {expected} tokens (t*h*w / {merge2})")
        if pixels is not None and pixels.shape[0] != vp.num_patches:
            raise ValueError(f"{'pixel_values' if kind == 1 else 'pixel_values_videos'} has {pixels.shape[0]} "
                             f"patches but {name}_grid_thw describes {vp.num_patches}")
    if second_per_grid_ts is not None and video_grid_thw is not None and \
            len(second_per_grid_ts) != len(video_grid_thw):
        raise ValueError(f"second_per_grid_ts has {len(second_per_grid_ts)} entries but video_grid_thw describes "
                         f"{len(video_grid_thw)} videos")
