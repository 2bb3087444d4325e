"""The checks ``syncfree.prepare`` runs on a processor batch before planning it (all on the host).

The patched forward itself checks only what stock checks, with stock's words, so that code and
tests written against stock behave the same. ``prepare()`` is syncfree's own API and can afford
to look closer, because everything is still on the host: where stock would raise, it raises with
stock's message (and detail after it); where stock would silently build wrong 3D positions
(placeholder runs that do not match the grids), it says so.
"""

from __future__ import annotations

import numpy as np
import torch

from .audio import audio_plan
from .batch import Draft, kept_sizes, span_types
from .errors import MaskShapeError
from .spec import ModelSpec
from .tensors import host_array

__all__ = ["check_inputs", "check_batch"]

_KIND = {1: "image", 2: "video"}


def _check_tokens(spec: ModelSpec, input_ids, mm_token_type_ids, attention_mask, ids_assumed: bool) -> None:
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
        ids_np, types_np = host_array(ids), host_array(types)
        kinds = ((1, spec.image_token_id), (2, spec.video_token_id))
        if spec.video_span_ids is not None:  # image placeholders typed by video spans: the types must be those
            spans = span_types(ids_np, spec.image_token_id, *spec.video_span_ids)
            if not np.array_equal(types_np, spans):
                raise ValueError(
                    f"mm_token_type_ids marks {int((types_np == 1).sum())} image and {int((types_np == 2).sum())} "
                    f"video placeholders but input_ids holds {int((spans == 1).sum())} image tokens "
                    f"{spec.image_token_id} outside video spans and {int((spans == 2).sum())} inside them")
            kinds = ()
        elif spec.video.frames_as_images:  # video frames are image placeholders typed 2: both kinds mark image tokens
            types_np, kinds = np.where(types_np == 2, 1, types_np), kinds[:1]
        for kind, token in kinds:
            marked, found = types_np == kind, ids_np == token
            if not np.array_equal(marked, found):
                source = (f"the {_KIND[kind]}_token_id syncfree assumed); pass the model or its config as "
                          "syncfree.prepare(batch, device, model)" if ids_assumed
                          else f"the model's {_KIND[kind]}_token_id); the two must mark the same tokens")
                raise ValueError(
                    f"mm_token_type_ids marks {int(marked.sum())} tokens as {_KIND[kind]} placeholders but input_ids "
                    f"holds {int(found.sum())} token {token} ({source}")
    reference = ids if ids is not None else types
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 and \
            attention_mask.shape != reference.shape:
        raise MaskShapeError(f"attention_mask {tuple(attention_mask.shape)} must match the tokens "
                             f"{tuple(reference.shape)}")


def check_inputs(spec: ModelSpec, *, input_ids=None, mm_token_type_ids=None, attention_mask=None,
                 feature_attention_mask=None, input_features=None, ids_assumed: bool = False, **_) -> None:
    """What can be checked before planning: the tokens' shapes and placeholder ids, and the audio features."""
    _check_tokens(spec, input_ids, mm_token_type_ids, attention_mask, ids_assumed)
    if spec.audio_window is not None:  # (an audio encoder's plan, AudioLayout.encoder; other audio needs no check here)
        _check_audio(spec, input_ids, feature_attention_mask, input_features)


def check_batch(draft: Draft, *, pixel_values=None, pixel_values_videos=None, second_per_grid_ts=None,
                video_second_per_grid=None, video_grid_thw=None, **_) -> None:
    """Raise ``ValueError`` naming the first inconsistency between tokens, grids and pixels, on the draft of
    the plan (its vision plans and placeholder runs: everything is derived once)."""
    spec = draft.spec
    # The seconds per video's temporal patch: the shared name, and the name of processors with an audio encoder.
    seconds, seconds_name = second_per_grid_ts, "second_per_grid_ts"
    if spec.audio_window is not None:
        seconds, seconds_name = video_second_per_grid, "video_second_per_grid"
    merge2 = spec.spatial_merge_size ** 2
    if draft.mask is not None and (draft.image or draft.video) and spec.rope.audio_class is None and spec.rope.mrope:
        empty = np.flatnonzero(~host_array(draft.mask).any(1))
        if empty.size:  # stock's get_rope_index fails there (torch.cat of no positions); say why
            raise ValueError(f"row {empty[0]} of attention_mask is all padding: stock's get_rope_index cannot place "
                             "the positions of a row without tokens (drop the row)")
    for kind, name, vp, pixels in ((1, "image", draft.image, pixel_values),
                                   (2, "video", draft.video, pixel_values_videos)):
        tokens = draft.stock_count(kind)
        grids = grid_name(spec, kind)  # (the input the batch carries the grid rows in: a family may name its own)
        if vp is None:
            if pixels is not None:
                raise ValueError(f"{'pixel_values' if kind == 1 else 'pixel_values_videos'} given without {grids}")
            continue
        features = sum(kept_sizes(draft.host, vp) if kind == 2 else vp.split_sizes)
        compression = draft.host.get("video_compression_mask") if kind == 2 else None
        if compression is not None and tuple(compression.shape) != (sum(vp.split_sizes),):
            raise ValueError(f"video_compression_mask has shape {tuple(compression.shape)} but {grids} "
                             f"describes {sum(vp.split_sizes)} video features")
        if tokens != features:  # stock's words (get_placeholder_mask), then what it means
            words = (f"{name.capitalize()} features and {name} tokens do not match, tokens: {tokens}, features: "
                     f"{features}" if spec.hooks.feature_words is None else  # (the family's stock says it otherwise)
                     spec.hooks.feature_words(name, tokens, features, spec))
            raise ValueError(f"{words} ({grids} describes {len(vp.split_sizes)} {name}s of "
                             f"{list(vp.split_sizes)} tokens)")
        runs = draft.runs.lengths[draft.runs.kinds == kind]
        if kind == 2 and spec.video.frames_as_runs:  # each frame between its own start/end tokens
            expected = [h * w // merge2 for t, h, w in vp.grid_thw.tolist() for _ in range(t)]
            unit = "video frame"
        else:
            # (compared as arrays: a NaViT batch has thousands of crops)
            expected, unit = vp.split_array if vp.split_array is not None else vp.split_sizes, name
        if not np.array_equal(runs, expected) and spec.rope.mrope and not (kind == 2 and spec.audio_token_id is not None):
            runs, expected = runs.tolist(), np.asarray(expected).tolist()
            # (A video carrying its audio has its pads interleaved with the audio's: runs do not apply.
            # Without 3D positions, stock places features in token order whatever the runs.)
            rule = spec.tower.split_rule(spec.spatial_merge_size)  # (the tower's: with extra tokens, its own)
            raise ValueError(f"the {name} placeholder runs in the tokens have {runs} tokens but {grids} "
                             f"needs one run per {unit} of {expected} tokens ({rule})")
        # (Grids from the family's own inputs, NaViT crops: pixels in one (1, C, p, patches * p) strip)
        patches = pixels.shape[-1] // spec.patch_size if spec.hooks.grid_inputs and pixels is not None else \
            getattr(pixels, "shape", (0,))[0]
        if pixels is not None and patches != vp.num_patches:
            raise ValueError(f"{'pixel_values' if kind == 1 else 'pixel_values_videos'} has {patches} "
                             f"patches but {grids} describes {vp.num_patches}")
    if seconds is not None and video_grid_thw is not None and len(seconds) != len(video_grid_thw):
        raise ValueError(f"{seconds_name} has {len(seconds)} entries but {grid_name(spec, 2)} describes "
                         f"{len(video_grid_thw)} videos")


def grid_name(spec: ModelSpec, kind: int) -> str:
    """The input a batch carries its image (``kind`` 1) or video (2) grid rows in: ``image_grid_thw`` /
    ``video_grid_thw``, or the family's own (``PlanHooks.grid_inputs``: NaViT crop sizes, say)."""
    own = spec.hooks.grid_inputs
    return own[kind - 1] if own else ("image_grid_thw", "video_grid_thw")[kind - 1]


def _check_audio(spec: ModelSpec, input_ids, feature_attention_mask, input_features) -> None:
    """An audio encoder's plan (``AudioLayout.encoder``): the audio placeholders against the audio features the batch
    carries."""
    tokens = int((input_ids == spec.audio_token_id).sum()) if input_ids is not None else 0
    if feature_attention_mask is None:
        if input_features is not None:
            raise ValueError("input_features given without feature_attention_mask (the model needs the mask to "
                             "find each clip's frames)")
        if tokens:
            raise ValueError(f"input_ids hold {tokens} audio placeholders (token {spec.audio_token_id}) but the batch "
                             "has no audio features (input_features and feature_attention_mask); a video's audio "
                             "track needs its features too")
        return
    if input_features is None:
        raise ValueError("feature_attention_mask given without input_features")
    plan = audio_plan(feature_attention_mask, spec.vision_module, *spec.audio_window)
    if input_features.dim() != 3 or input_features.shape[0] != feature_attention_mask.shape[0] \
            or input_features.shape[2] != feature_attention_mask.shape[1]:
        raise ValueError(f"input_features {tuple(input_features.shape)} must be (clips, mel bins, frames) matching "
                         f"feature_attention_mask {tuple(feature_attention_mask.shape)}")
    features = plan.n_outputs
    if tokens != features:
        raise ValueError(f"Audio features and audio tokens do not match, tokens: {tokens}, features: {features} "
                         f"(feature_attention_mask describes {len(plan.feature_lens)} clips of "
                         f"{plan.feature_lens.tolist()} frames)")
