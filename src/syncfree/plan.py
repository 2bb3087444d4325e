"""The host-side plan: everything a Qwen-VL forward derives from its small control tensors, computed once.

``grid_thw``, ``input_ids``, ``mm_token_type_ids`` and ``attention_mask`` come
out of the processor on the CPU. Everything the forward needs from them for
control flow (segment lengths and split sizes as Python ints, the maximum
segment length) or for indexing (cumulative lengths, rotary and interpolation
indices, placeholder positions, 3D rotary positions) is computed here, on the
host, and validated. ``Plan.to(device)`` then moves the tensors with pinned,
non-blocking copies; the Python ints stay on the host, where the patched
forward reads them without ever asking the device.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass, field

import torch

from .rope import rope_index

__all__ = ["Plan", "VisionPlan", "ModelSpec", "build_plan"]


@dataclass(frozen=True)
class ModelSpec:
    """The config values a plan depends on (checked against the model at forward time)."""

    model_type: str
    spatial_merge_size: int
    num_grid_per_side: int | None  # learned position table side (Qwen3-VL); None: no interpolation
    image_token_id: int
    video_token_id: int
    vision_module: str  # where the stock vision helpers live (a transformers modeling module)
    window_size: int | None = None  # window attention (Qwen2.5-VL)
    patch_size: int = 16
    split_video_frames: bool = True  # Qwen3-VL: one placeholder run per frame; Qwen2/2.5: one per video
    tokens_per_second: float | None = None  # Qwen2.5-VL video time scaling
    truncate_seconds: bool = False  # Transformers <= 5.17 truncated second_per_grid_ts to int before scaling

    @classmethod
    def from_config(cls, config) -> "ModelSpec":
        model_type = config.model_type
        vc = config.vision_config
        qwen3 = model_type.startswith("qwen3_vl")
        module = f"transformers.models.{model_type}.modeling_{model_type}"
        return cls(
            model_type, vc.spatial_merge_size, int(vc.num_position_embeddings**0.5) if qwen3 else None,
            config.image_token_id, config.video_token_id, module,
            window_size=vc.window_size if model_type == "qwen2_5_vl" else None, patch_size=vc.patch_size,
            split_video_frames=qwen3,
            tokens_per_second=vc.tokens_per_second if model_type == "qwen2_5_vl" else None,
            truncate_seconds=model_type == "qwen2_5_vl" and _truncates_seconds(module),
        )

    def rope_options(self, second_per_grid_ts=None) -> dict:
        """The keyword arguments of ``rope_index`` for this model family."""
        options = {"spatial_merge_size": self.spatial_merge_size, "split_video_frames": self.split_video_frames}
        if self.tokens_per_second is not None:
            options.update(tokens_per_second=self.tokens_per_second, second_per_grid_ts=second_per_grid_ts,
                           truncate_seconds=self.truncate_seconds)
        return options

    @classmethod
    def for_vision_model(cls, visual) -> "ModelSpec":
        """The vision-side values, from a vision tower alone (token ids unknown: -1)."""
        vc = visual.config
        module = type(visual).__module__
        return cls(
            module.rsplit(".", 1)[-1].removeprefix("modeling_"), vc.spatial_merge_size,
            getattr(visual, "num_grid_per_side", None), -1, -1, module,
            window_size=getattr(visual, "window_size", None), patch_size=vc.patch_size,
        )


@functools.lru_cache(maxsize=None)
def _truncates_seconds(module_name: str) -> bool:
    # Older Transformers computed Qwen2.5-VL's video time step as tokens_per_second * int(seconds).
    import inspect

    module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    return "int(next(second_per_grid_ts))" in inspect.getsource(module.Qwen2_5_VLModel.get_rope_index)


def _move(t: torch.Tensor, device) -> torch.Tensor:
    # Pinned + non_blocking: the copy is queued and the host goes on (no wait, no sync).
    if device is None or torch.device(device).type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


@dataclass
class VisionPlan:
    """What the vision tower derives from one modality's ``grid_thw``."""

    grid_thw: torch.Tensor  # (N, 3), on the host
    seqlens: tuple[int, ...]  # attention segment lengths: one per frame (h * w patches)
    split_sizes: tuple[int, ...]  # merged tokens per image or video
    max_seqlen: int
    cu_seqlens: torch.Tensor  # (segments + 1,) int32
    position_ids: torch.Tensor  # (patches, 2) rotary (row, col) ids
    interp_indices: torch.Tensor | None = None  # (patches, taps) into the learned position table (Qwen3-VL)
    interp_weights: torch.Tensor | None = None
    window_index: torch.Tensor | None = None  # merged-patch permutation into windows (Qwen2.5-VL)
    cu_window_seqlens: torch.Tensor | None = None
    window_seqlens: tuple[int, ...] = ()
    max_window_seqlen: int = 0

    _TENSORS = ("cu_seqlens", "position_ids", "interp_indices", "interp_weights", "window_index", "cu_window_seqlens")

    @property
    def num_patches(self) -> int:
        return sum(self.seqlens)

    def to(self, device) -> "VisionPlan":
        moved = {f: _move(getattr(self, f), device) for f in self._TENSORS if getattr(self, f) is not None}
        return dataclasses.replace(self, **moved)

    def vision_kwargs(self) -> dict:
        """Keyword arguments for the vision tower: the stock helpers take these instead of computing them."""
        kwargs = {"cu_seqlens": self.cu_seqlens, "max_seqlen": self.max_seqlen, "position_ids": self.position_ids}
        # Attention layers find their host split sizes by the length of the cu_seqlens they are given
        # (full and window segmentations; equal lengths mean equal segmentations).
        seqlens = {len(self.seqlens) + 1: self.seqlens}
        if self.interp_indices is not None:
            kwargs.update(interp_indices=self.interp_indices, interp_weights=self.interp_weights)
        if self.window_index is not None:
            kwargs.update(window_index=self.window_index, cu_window_seqlens=self.cu_window_seqlens,
                          max_window_seqlen=self.max_window_seqlen)
            seqlens[len(self.window_seqlens) + 1] = self.window_seqlens
        kwargs["syncfree_seqlens"] = seqlens
        return kwargs


def vision_plan(grid_thw: torch.Tensor, spec: ModelSpec, name: str = "grid_thw") -> VisionPlan:
    """Build a VisionPlan on the host with the installed Transformers' own helpers (so the numbers match)."""
    grid = _check_grid(grid_thw, spec.spatial_merge_size, name)
    module = sys.modules.get(spec.vision_module) or __import__(spec.vision_module, fromlist=["_"])
    merge = spec.spatial_merge_size
    extra = {}
    if spec.num_grid_per_side is not None:
        extra["interp_indices"], extra["interp_weights"] = module.get_vision_interpolation_indices_and_weights(
            grid, num_grid_per_side=spec.num_grid_per_side, mode="bilinear", align_corners=True,
            spatial_merge_size=merge,
        )
    if spec.window_size is not None:
        window_index, cu_window = module.get_vision_window_index(
            grid, spatial_merge_size=merge, window_size=spec.window_size, patch_size=spec.patch_size)
        window_seqlens = tuple((cu_window[1:] - cu_window[:-1]).tolist())  # host tensor: no device involved
        extra.update(window_index=window_index, cu_window_seqlens=cu_window, window_seqlens=window_seqlens,
                     max_window_seqlen=max(window_seqlens))
    position_ids = module.get_vision_position_ids(grid, merge)
    rows = grid.tolist()  # host tensor: no device involved
    seqlens = tuple(h * w for t, h, w in rows for _ in range(t))
    cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(seqlens, dtype=torch.int64).cumsum(0)
    return VisionPlan(
        grid_thw=grid, seqlens=seqlens, split_sizes=tuple(t * h * w // merge**2 for t, h, w in rows),
        max_seqlen=max(seqlens), cu_seqlens=cu, position_ids=position_ids, **extra,
    )


def _check_grid(grid, merge: int, name: str) -> torch.Tensor:
    if not isinstance(grid, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of shape (N, 3), got {type(grid).__name__}")
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.shape[0] == 0:
        raise ValueError(f"{name} must have shape (N, 3) with N >= 1, got {tuple(grid.shape)}")
    if grid.dtype.is_floating_point or grid.dtype == torch.bool or grid.is_complex():
        raise ValueError(f"{name} must hold integers (torch.long), got {grid.dtype}")
    grid = grid.to("cpu", torch.long)
    if bool((grid <= 0).any()):
        raise ValueError(f"{name} must be positive everywhere, got {grid.tolist()}")
    if bool((grid[:, 1:] % merge != 0).any()):
        raise ValueError(f"{name} heights and widths must be multiples of spatial_merge_size={merge}, "
                         f"got {grid.tolist()}")
    return grid


@dataclass
class Plan:
    """The whole forward's plan. Tensors live where ``device`` says; ints and sizes on the host."""

    spec: ModelSpec
    batch_shape: tuple[int, int]
    image: VisionPlan | None
    video: VisionPlan | None
    n_image_tokens: int
    n_video_tokens: int
    visual_positions: torch.Tensor  # flat (b * S + s) positions of all vision placeholders, in order
    image_in_visual: torch.Tensor  # where image features go among the visual positions
    video_in_visual: torch.Tensor
    position_ids: torch.Tensor | None  # (3, B, S) M-RoPE positions, as get_rope_index returns them
    rope_deltas: torch.Tensor | None  # (B, 1)
    padding_free: bool  # attention_mask is absent or all ones
    device: str = "cpu"
    extra: dict = field(default_factory=dict)

    def to(self, device) -> "Plan":
        moved = {name: _move(getattr(self, name), device) if getattr(self, name) is not None else None
                 for name in ("visual_positions", "image_in_visual", "video_in_visual", "position_ids",
                              "rope_deltas")}
        return dataclasses.replace(
            self, image=self.image.to(device) if self.image else None,
            video=self.video.to(device) if self.video else None, device=str(torch.device(device)), **moved,
        )

    def expanded(self, batch_size: int) -> "Plan":
        """The plan for each row repeated ``batch_size // rows`` times, as generate() expands inputs
        for beams and ``num_return_sequences``. Rebuilt on the host from the kept host inputs: no sync."""
        rows = self.batch_shape[0]
        if batch_size == rows:
            return self
        if batch_size % rows:
            raise ValueError(f"a syncfree plan for {rows} rows cannot describe a batch of {batch_size}")
        k, host = batch_size // rows, self.extra["host"]
        tokens = {n: host[n].repeat_interleave(k, dim=0) if host.get(n) is not None else None
                  for n in ("input_ids", "mm_token_type_ids", "attention_mask")}
        grids = {}
        for name, per_row in (("image_grid_thw", self.extra["images_per_row"]),
                              ("video_grid_thw", self.extra["videos_per_row"]),
                              ("second_per_grid_ts", self.extra["videos_per_row"])):
            grid = host.get(name)
            if grid is not None and not isinstance(grid, torch.Tensor):
                grid = torch.as_tensor(grid)
            if grid is None:
                grids[name] = None
                continue
            chunks = torch.split(grid, per_row)
            grids[name] = torch.cat([c for c in chunks for _ in range(k)])
        return build_plan(self.spec, **tokens, **grids, grids_optional=True).to(self.device)

    def check_model(self, spec: ModelSpec) -> None:
        if spec != self.spec:
            differ = [f"{f.name}={getattr(self.spec, f.name)!r} (model: {getattr(spec, f.name)!r})"
                      for f in dataclasses.fields(spec) if getattr(spec, f.name) != getattr(self.spec, f.name)]
            raise ValueError(
                f"this syncfree plan was built for other model values: {', '.join(differ)}; pass the model "
                "(or its config) to syncfree.prepare()"
            )


def _runs(types_row: torch.Tensor, kind: int) -> list[int]:
    """Lengths of the runs of ``kind`` in one row of token types (host tensor)."""
    values, counts = torch.unique_consecutive(types_row, return_counts=True)
    return counts[values == kind].tolist()


def build_plan(spec: ModelSpec, *, input_ids=None, mm_token_type_ids=None, attention_mask=None,
               image_grid_thw=None, video_grid_thw=None, second_per_grid_ts=None, pixel_values=None,
               pixel_values_videos=None, grids_optional: bool = False) -> Plan:
    """Validate the inputs and build the plan on the host.

    The token and grid tensors must be on the CPU; of the pixel tensors only the shapes are read.
    ``grids_optional``: the features were computed already (no pixels), so placeholders need no grid.
    """
    merge2 = spec.spatial_merge_size**2
    if mm_token_type_ids is None:
        if input_ids is None:
            raise ValueError("syncfree needs mm_token_type_ids (or input_ids) to place multimodal features")
        mm_token_type_ids = (input_ids == spec.image_token_id).long() + 2 * (input_ids == spec.video_token_id).long()
    types = mm_token_type_ids.to("cpu", torch.long)
    if types.dim() != 2:
        raise ValueError(f"mm_token_type_ids must have shape (batch, sequence), got {tuple(types.shape)}")
    if input_ids is not None:
        if input_ids.shape != types.shape:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and mm_token_type_ids {tuple(types.shape)} "
                             "must have the same shape")
        for kind, token in ((1, spec.image_token_id), (2, spec.video_token_id)):
            if not torch.equal(types == kind, input_ids == token):
                raise ValueError(f"mm_token_type_ids marks {int((types == kind).sum())} tokens as "
                                 f"{'image' if kind == 1 else 'video'} placeholders but input_ids holds "
                                 f"{int((input_ids == token).sum())} token {token}")
    mask = None
    if attention_mask is not None:
        mask = attention_mask.to("cpu")
        if mask.shape != types.shape:
            raise ValueError(f"attention_mask {tuple(mask.shape)} must match the tokens {tuple(types.shape)}")
        types = torch.where(mask.bool(), types, torch.zeros_like(types))

    plans, n_runs, row_runs = {}, {}, {}
    for kind, name, grid, pixels in ((1, "image", image_grid_thw, pixel_values),
                                     (2, "video", video_grid_thw, pixel_values_videos)):
        row_runs[name] = [_runs(row, kind) for row in types]
        runs = [n for per_row in row_runs[name] for n in per_row]
        n_runs[name] = len(runs)
        if grid is None:
            if runs and not grids_optional:
                raise ValueError(f"the tokens hold {len(runs)} {name} placeholder runs but {name}_grid_thw is None")
            plans[name] = None
            continue
        vp = vision_plan(grid, spec, f"{name}_grid_thw")
        if kind == 2 and spec.split_video_frames:  # Qwen3-VL: each frame between its own start/end tokens
            expected = [h * w // merge2 for t, h, w in vp.grid_thw.tolist() for _ in range(t)]
            unit = "video frame"
        else:
            expected = list(vp.split_sizes)
            unit = name
        if len(runs) != len(expected):
            raise ValueError(f"the tokens hold {len(runs)} {unit} placeholder runs but {name}_grid_thw describes "
                             f"{len(expected)} {unit}s ({name} features without a placeholder, or placeholders "
                             "without features)")
        if runs != expected:
            raise ValueError(f"{name} placeholder runs have {runs} tokens but {name}_grid_thw needs {expected} "
                             f"(t*h*w / {merge2} per {unit})")
        if pixels is not None and pixels.shape[0] != vp.num_patches:
            raise ValueError(f"{'pixel_values' if kind == 1 else 'pixel_values_videos'} has {pixels.shape[0]} "
                             f"patches but {name}_grid_thw describes {vp.num_patches}")
        plans[name] = vp

    if second_per_grid_ts is not None and video_grid_thw is not None:
        n_videos = len(video_grid_thw)
        if len(second_per_grid_ts) != n_videos:
            raise ValueError(f"second_per_grid_ts has {len(second_per_grid_ts)} entries but video_grid_thw describes "
                             f"{n_videos} videos")

    flat = types.flatten()
    visual = torch.nonzero(flat > 0).flatten()
    joint = flat[visual]
    position_ids = rope_deltas = None
    # The 3D positions need a grid for every vision run (absent when generate() pre-encoded the pixels).
    if any(plans.values()) and all(plans[name] is not None or not n_runs[name] for name in plans):
        ids = input_ids if input_ids is not None else torch.zeros_like(types)
        position_ids, rope_deltas = rope_index(
            ids.to("cpu"), mm_token_type_ids.to("cpu"), image_grid_thw, video_grid_thw, mask,
            **spec.rope_options(second_per_grid_ts),
        )
    # Kept on the host so the plan can be rebuilt for an expanded batch (generate with beams).
    images_per_row = [len(r) for r in row_runs["image"]]
    frames_per_row = [len(r) for r in row_runs["video"]]
    videos_per_row = [] if spec.split_video_frames else frames_per_row
    if video_grid_thw is not None and spec.split_video_frames:
        frames = torch.as_tensor(video_grid_thw)[:, 0].cumsum(0).tolist()
        done = 0
        for n in frames_per_row:
            done += n
            videos_per_row.append(sum(1 for f in frames if f <= done) - sum(videos_per_row))
    host = {"input_ids": input_ids, "mm_token_type_ids": mm_token_type_ids, "attention_mask": attention_mask,
            "image_grid_thw": image_grid_thw, "video_grid_thw": video_grid_thw,
            "second_per_grid_ts": second_per_grid_ts}
    return Plan(
        spec=spec, batch_shape=tuple(types.shape), image=plans["image"], video=plans["video"],
        n_image_tokens=int((flat == 1).sum()), n_video_tokens=int((flat == 2).sum()), visual_positions=visual,
        image_in_visual=torch.nonzero(joint == 1).flatten(), video_in_visual=torch.nonzero(joint == 2).flatten(),
        position_ids=position_ids, rope_deltas=rope_deltas,
        padding_free=mask is None or bool(mask.bool().all()),
        extra={"host": {k: v.to("cpu") if isinstance(v, torch.Tensor) else v for k, v in host.items()},
               "images_per_row": images_per_row, "videos_per_row": videos_per_row},
    )
