"""The shared 3D rotary position index (M-RoPE), computed without a single host sync.

Stock ``get_rope_index`` (the multimodal ``*Model`` of each family with this index) walks each batch
row in Python: it drops padding with a boolean mask, groups the token types with ``itertools.groupby``
over ``.tolist()``, pulls grids with ``next(iter(grid))`` and ``.item()``, and builds the deltas with
``torch.tensor(list)``. Every one of those reads device memory on the host. Here the same numbers come
from whole-tensor ops whose output shapes depend only on input shapes, so on a GPU the work is queued
and the host never waits:

* Compaction without compaction. Stock positions depend on the order of the
  unmasked tokens only, so instead of removing padding we give each token its
  compacted index (``cumsum`` of the mask) and find the previous unmasked token
  with a running ``cummax`` of indices. A token starts a run when that previous
  token has another type (or there is none), which is exactly ``groupby`` on the
  compacted row.
* Grids by ordinal. Runs of one modality take grids in order across the whole
  batch, so a ``cumsum`` over the flattened (row-major) start flags numbers
  every run; ``index_select`` fetches its grid. Where each frame is its own run,
  a video contributes one run per temporal frame, so the frame ordinal is mapped
  to its video by ``searchsorted`` on the cumulative ``t``'s instead of expanding
  the grids with a value-dependent ``repeat_interleave``. Elsewhere a video is one run.
* Offsets as a prefix sum. Each text token advances the running position by 1
  and each vision run by ``max(h, w) // merge``; putting that advance on the run's
  first token and taking an exclusive ``cumsum`` gives every run its start.
* Too few grids (or video durations) is checked with ``torch._assert_async``:
  loud, but asynchronous on a GPU (and immediate on the CPU).

The families differ only in how videos are laid out and timed (keyword-only parameters):

==============================================  ===================  =================  ================
family's videos (``VideoLayout``)               split_video_frames   tokens_per_second  truncate_seconds
==============================================  ===================  =================  ================
each frame a run (``frames_as_runs``)           True (default)       None               False
one run per video                               False                None               False
video time scale (``time_scale``), 5.24         False                config value       False
video time scale, Transformers 5.17             False                config value       True
==============================================  ===================  =================  ================

A video time scale also passes the processor's ``second_per_grid_ts``. All families advance the position
after a vision run by ``max(h, w) // merge``, even when a video's time axis runs past it.
"""

from __future__ import annotations

import torch

from .errors import MaskShapeError

__all__ = ["rope_index", "check_options", "time_steps"]


def _grid_rows(grid: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The grids on ``device`` as int64, or one dummy row of ones when there are none.

    The dummy keeps every gather well-formed (and shape-static) when a modality is
    absent; the count assertion makes sure no real run ever reads it.
    """
    if grid is None or grid.shape[0] == 0:
        return torch.ones((1, 3), dtype=torch.long, device=device)
    # A host->device copy waits for no queued kernel (it is not a sync), though from
    # pageable memory CUDA stages it on the host: pass grids on the device to avoid even
    # that. A copy to the host must not be non-blocking, or it could be read too early.
    return grid.to(device=device, dtype=torch.long, non_blocking=device.type != "cpu")


def time_steps(tokens_per_second, second_per_grid_ts, truncate_seconds: bool,
                device: torch.device) -> tuple[torch.Tensor, int | None]:
    """The temporal position step per frame of each video (a video time scale), and how many videos it covers.

    Stock computes ``tokens_per_second * seconds`` per video (seconds 1 when none are given) and then
    ``(arange(t) * step).long()``; Transformers 5.17 took ``int(seconds)`` first and skipped ``.long()``
    (its step is an int, so the positions are int64 all the same). The dtype is kept as stock has it
    (the product of a float tensor stays in that float dtype), so the later truncation matches.
    """
    if second_per_grid_ts is None:
        return torch.full((1,), tokens_per_second, dtype=torch.long, device=device), None
    if torch.is_tensor(second_per_grid_ts):
        seconds = second_per_grid_ts.to(device=device, non_blocking=device.type != "cpu").reshape(-1)
        steps = tokens_per_second * (seconds.long() if truncate_seconds else seconds)
    else:
        # Python numbers: stock multiplies them in double precision, and the float step then meets
        # an int64 arange in the default float dtype.
        seconds = torch.tensor([float(s) for s in second_per_grid_ts], dtype=torch.float64)
        steps = tokens_per_second * (seconds.long() if truncate_seconds else seconds)
        steps = steps if truncate_seconds else steps.to(torch.get_default_dtype())
        steps = steps.to(device=device, non_blocking=device.type != "cpu")
    count = steps.shape[0]
    return (steps if count else torch.ones(1, dtype=steps.dtype, device=device)), count


def check_options(tokens_per_second, second_per_grid_ts, truncate_seconds: bool, split_video_frames: bool) -> None:
    if tokens_per_second is None and (second_per_grid_ts is not None or truncate_seconds):
        raise ValueError("second_per_grid_ts and truncate_seconds need tokens_per_second (a video time scale)")
    if split_video_frames and tokens_per_second is not None:
        raise ValueError("video time scaling (tokens_per_second) applies to whole-video runs: "
                         "pass split_video_frames=False")


def rope_index(input_ids, mm_token_type_ids, image_grid_thw=None, video_grid_thw=None, attention_mask=None,
               *, spatial_merge_size: int, split_video_frames: bool = True, tokens_per_second: int | None = None,
               second_per_grid_ts=None, truncate_seconds: bool = False,
               video_temporal_merge: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as stock ``get_rope_index`` of a family with this index (each of the layouts above), with no host
    sync.

    Args:
        spatial_merge_size: ``config.vision_config.spatial_merge_size``.
        split_video_frames: True (the default): each video frame is its own run of ``h*w/merge**2`` tokens
            (with timestamp text between frames), matched to the videos' frames in order. False: a whole
            video is one run of ``t*h*w/merge**2`` tokens, whose temporal position is ``start + frame * step``.
        tokens_per_second: a video time scale only (``config.vision_config.tokens_per_second``): the video time
            step becomes ``tokens_per_second * second_per_grid_ts[video]``. None: step 1 (also where each frame
            is its own run, with no time axis inside a run). Images are never scaled.
        second_per_grid_ts: the processor's seconds per temporal grid, one per video (a tensor, as the
            processor gives it, or a list of Python numbers); None counts 1 second per video. Expected >= 0.
        truncate_seconds: older Transformers (5.17 does, 5.24 does not): ``int(seconds)`` before scaling
            (a 0.5 s grid gets step 0). False: scale the seconds as they are, truncate the product.
        video_temporal_merge: frames per video token (2: a video's run holds t // 2 frames). Nothing
            here depends on it: a run's frame is its offset over the frame's area, whatever t is.

    Returns (position_ids of shape (3, B, S) with dtype input_ids.dtype on input_ids.device,
    deltas of shape (B, 1) int64 on input_ids.device). Padding positions are 0.
    """
    check_options(tokens_per_second, second_per_grid_ts, truncate_seconds, split_video_frames)
    device = input_ids.device
    B, S = input_ids.shape
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 and attention_mask.shape != (B, S):
        raise MaskShapeError(f"attention_mask {tuple(attention_mask.shape)} must match the tokens {(B, S)}")
    merge = spatial_merge_size
    types = mm_token_type_ids.to(device=device, dtype=torch.long)
    if attention_mask is None:
        keep = torch.ones((B, S), dtype=torch.bool, device=device)
    else:
        keep = attention_mask.to(device).bool()  # stock keeps every nonzero entry
    idx = torch.arange(S, device=device).expand(B, S)

    # Compacted index of each kept token, and the index of the kept token before it
    # (-1 if none): the running max of kept indices, shifted right by one.
    compact = keep.long().cumsum(1) - 1
    last_kept = torch.where(keep, idx, -1).cummax(1).values
    prev = torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=device), last_kept[:, :-1]], 1)
    prev_type = types.gather(1, prev.clamp(min=0))
    start = keep & ((prev < 0) | (prev_type != types))
    # Offset inside the run: distance, in compacted tokens, to the run's first token.
    # Masked tokens inside a run carry it along harmlessly (they are zeroed at the end).
    k = compact - torch.where(start, compact, -1).cummax(1).values

    is_img = keep & (types == 1)
    is_vid = keep & (types == 2)

    # Global run ordinals, row-major over the batch (runs never span rows: a row's
    # first kept token always starts one). Tokens take their run's ordinal.
    img_ord = (start & is_img).flatten().cumsum(0).view(B, S) - 1
    vid_ord = (start & is_vid).flatten().cumsum(0).view(B, S) - 1
    vid_runs = (start & is_vid).sum()

    images = _grid_rows(image_grid_thw, device)
    videos = _grid_rows(video_grid_thw, device)
    n_images = 0 if image_grid_thw is None else image_grid_thw.shape[0]
    n_videos = 0 if video_grid_thw is None else video_grid_thw.shape[0]
    # Loud but asynchronous: a device-side assert, no read on the host. Dynamo traces it
    # into the graph (no break), and on the CPU it raises at once.
    torch._assert_async((start & is_img).sum() <= n_images,
                        "rope_index: the tokens hold more image runs than image_grid_thw has grids")
    if split_video_frames:
        # One run per video frame; frame ordinal f belongs to the first video whose
        # cumulative frame count exceeds f.
        frames_end = videos[:, 0].cumsum(0)
        torch._assert_async(vid_runs <= (frames_end[-1] if n_videos else 0),
                            "rope_index: the tokens hold more video frames than video_grid_thw has frames")
        vid_of = torch.searchsorted(frames_end, vid_ord.clamp(min=0).flatten(), right=True)
    else:
        torch._assert_async(vid_runs <= n_videos,
                            "rope_index: the tokens hold more video runs than video_grid_thw has grids")
        vid_of = vid_ord.clamp(min=0).flatten()
    vid_of = vid_of.clamp(max=videos.shape[0] - 1)

    img_grid = images.index_select(0, img_ord.clamp(0, images.shape[0] - 1).flatten()).view(B, S, 3)
    vid_grid = videos.index_select(0, vid_of).view(B, S, 3)
    is_vis = is_img | is_vid
    grid = torch.where(is_img.unsqueeze(-1), img_grid, vid_grid)
    h = torch.where(is_vis, grid[..., 1], merge)  # text: a harmless 1x1 grid, no division by zero
    w = torch.where(is_vis, grid[..., 2], merge)

    # Each text token advances the position by one; each vision run by max(h, w)//merge,
    # booked on its first token. The exclusive prefix sum is where each token starts.
    advance = torch.maximum(h, w) // merge
    step = torch.where(keep & (types == 0), 1, 0) + torch.where(start & is_vis, advance, 0)
    before = step.cumsum(1) - step
    # Later tokens of a vision run already count the run's own advance: take it back.
    base = before - torch.where(is_vis & ~start, advance, 0)

    # Within the merged (t, h/merge, w/merge) grid, row-major with t outermost.
    hm, wm = (h // merge).clamp(min=1), (w // merge).clamp(min=1)  # clamp: never divide by zero
    frame, rest = k // (hm * wm), k % (hm * wm)
    if tokens_per_second is not None:
        # Video frames sit step apart in time (truncated like stock's .long()); images are unscaled.
        steps, n_steps = time_steps(tokens_per_second, second_per_grid_ts, truncate_seconds, device)
        if n_steps is not None:
            torch._assert_async(vid_runs <= n_steps,
                                "rope_index: the tokens hold more video runs than second_per_grid_ts has entries")
        video_step = steps.index_select(0, vid_of.clamp(max=steps.shape[0] - 1)).view(B, S)
        frame = torch.where(is_vid, (frame * video_step).long(), frame)
    zero = torch.zeros_like(k)
    t_pos = base + torch.where(is_vis, frame, zero)
    h_pos = base + torch.where(is_vis, rest // wm, zero)
    w_pos = base + torch.where(is_vis, rest % wm, zero)
    pos = torch.where(keep, torch.stack([t_pos, h_pos, w_pos]), 0)

    # Positions are >= 0 and padding is 0, so a plain max over the row is the max over
    # its kept tokens (stock fails on a row with none; here such a row gets delta 1).
    deltas = pos.amax(dim=(0, 2)) + 1 - keep.long().sum(1)
    return pos.to(input_ids.dtype), deltas.unsqueeze(1)
