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
from dataclasses import dataclass

import torch

from .plan_tensors import DeviceFields, move
from .plan_audio import AudioPlan
from .plan_omni import omni_fields, omni_rope, rope_config_key
from .rope import rope_index

__all__ = ["Plan", "VisionPlan", "ModelSpec", "build_plan", "vision_plan", "PLAN_INPUTS"]


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
    # Omni thinkers: audio placeholders, the audio encoder's windows, and the stock rope index run on the host.
    audio_token_id: int | None = None
    audio_window: tuple[int, int] | None = None  # (n_window, n_window_infer) of the audio encoder
    rope_class: str | None = None  # the class whose stock get_rope_index the plan runs on the host
    rope_key: tuple = ()  # the config values that index reads
    config: object = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_config(cls, config) -> "ModelSpec":
        from .models.families import FAMILIES

        model_type = config.model_type
        family = FAMILIES.get(model_type)
        if family is None:
            raise ValueError(f"syncfree does not support model type {model_type!r} (supported: {', '.join(FAMILIES)})")
        vc = config.vision_config
        module = family.modeling
        omni = {}
        if family.audio:
            ac = config.audio_config
            omni = dict(audio_token_id=config.audio_token_id, audio_window=(ac.n_window, getattr(ac, "n_window_infer", 0)),
                        rope_class=family.rope_class, rope_key=rope_config_key(config), config=config)
        return cls(
            model_type, vc.spatial_merge_size,
            int(vc.num_position_embeddings**0.5) if family.learned_positions else None,
            config.image_token_id, config.video_token_id, module,
            window_size=vc.window_size if family.windows else None, patch_size=vc.patch_size,
            split_video_frames=family.frames_as_runs,
            tokens_per_second=vc.tokens_per_second if family.video_time_scale else None,
            truncate_seconds=family.video_time_scale and _truncates_seconds(module), **omni,
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


@dataclass
class VisionPlan(DeviceFields):
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
    device: str = "cpu"  # where the tensors above live (grid_thw stays on the host)

    _TENSORS = ("cu_seqlens", "position_ids", "interp_indices", "interp_weights", "window_index", "cu_window_seqlens")

    @property
    def num_patches(self) -> int:
        return sum(self.seqlens)

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


PLAN_INPUTS = ("input_ids", "mm_token_type_ids", "attention_mask", "image_grid_thw", "video_grid_thw",
               "second_per_grid_ts", "feature_attention_mask", "video_second_per_grid", "position_ids")


@dataclass
class Plan:
    """What the forward derives from its control tensors, for one batch. Tensors live where ``device``
    says; counts and sizes are Python ints on the host.

    The plan follows stock semantics: placeholders are counted in ``input_ids`` over every position,
    masked or not (stock places features into all of them), while the 3D rotary positions skip
    masked tokens, as stock ``get_rope_index`` does.
    """

    spec: ModelSpec
    batch_shape: tuple[int, int]
    image: VisionPlan | None
    video: VisionPlan | None
    n_image_tokens: int  # placeholders in the tokens, as stock get_placeholder_mask counts them
    n_video_tokens: int
    position_ids: torch.Tensor | None  # (3, B, S), as get_rope_index returns them; None if not computable
    rope_deltas: torch.Tensor | None  # (B, 1)
    host_mask: torch.Tensor | None  # the 2D attention mask (its values as given), on the host; None without one
    host: dict  # the host inputs the plan was built from (kept to rebuild it for an expanded batch)
    images_per_row: tuple[int, ...] = ()
    videos_per_row: tuple[int, ...] = ()
    device: str = "cpu"
    # Omni thinkers: the audio encoder's plan, the audio placeholders, and the flag the positions were made for.
    audio: AudioPlan | None = None
    n_audio_tokens: int = 0
    use_audio_in_video: bool = False
    rope_cache: dict = dataclasses.field(default_factory=dict)  # flag -> positions made on demand (the other flag)

    @property
    def n_visual_tokens(self) -> int:
        return self.n_image_tokens + self.n_video_tokens

    def to(self, device) -> "Plan":
        moved = {name: move(getattr(self, name), device) if getattr(self, name) is not None else None
                 for name in ("position_ids", "rope_deltas")}
        return dataclasses.replace(
            self, image=self.image.to(device) if self.image else None,
            video=self.video.to(device) if self.video else None, device=str(torch.device(device)), **moved,
            audio=self.audio.to(device) if self.audio else None, rope_cache={},
        )

    def pin_memory(self) -> "Plan":
        """The plan with its host tensors in pinned memory. A ``DataLoader`` with ``pin_memory=True`` calls
        this for a plan in a batch (``prepare(batch)`` in a worker), so moving it later does not block."""
        if self.device != "cpu":
            return self
        pinned = {n: getattr(self, n).pin_memory() for n in ("position_ids", "rope_deltas") if getattr(self, n) is not None}
        return dataclasses.replace(self, image=self.image.pin_memory() if self.image else None,
                                   video=self.video.pin_memory() if self.video else None, **pinned,
                                   audio=self.audio.pin_memory() if self.audio else None)

    def omni_positions(self, use_audio_in_video) -> tuple[torch.Tensor, torch.Tensor] | None:
        """An Omni thinker's 3D positions for this flag (the plan's own, or made on the host now: no wait)."""
        flag = bool(use_audio_in_video)
        if flag == self.use_audio_in_video:
            return (self.position_ids, self.rope_deltas) if self.position_ids is not None else None
        if flag not in self.rope_cache:
            found = omni_rope(self.spec, self.host, self.host_mask, flag)
            self.rope_cache[flag] = tuple(move(t, self.device) for t in found) if found is not None else None
        return self.rope_cache[flag]

    def check_batch(self, batch) -> None:
        """Refuse a batch this plan was not built from (sliced, packed or edited after ``prepare()``).

        Compares the host inputs the plan keeps with the batch's (host tensors: no sync)."""
        for name in PLAN_INPUTS:
            value, kept = batch.get(name), self.host.get(name)
            if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
                continue
            kept = torch.as_tensor(kept) if kept is not None else None
            if kept is None or value.shape != kept.shape or not torch.equal(value, kept.to(value.dtype)):
                raise ValueError(
                    f"the batch's {name} is not the one its syncfree plan was built from (was the batch sliced, "
                    "packed or edited after syncfree.prepare()?); call syncfree.prepare() on the final batch"
                )

    def expanded(self, rows: int) -> "Plan":
        """The plan for each row repeated ``rows // batch rows`` times, as generate() expands inputs for
        beams and ``num_return_sequences``. Rebuilt on the host from the kept host inputs: no sync."""
        own = self.batch_shape[0]
        if rows == own:
            return self
        if rows % own:
            raise ValueError(f"a syncfree plan for {own} rows cannot describe a batch of {rows}")
        k, host = rows // own, self.host
        if self.spec.rope_class is not None:
            # An Omni thinker's generate() repeats every batch tensor row by row (GenerationMixin's default):
            # the plan describes what the forward will then be given.
            return build_plan(self.spec, use_audio_in_video=self.use_audio_in_video, **{
                n: v.repeat_interleave(k, dim=0) if isinstance(v, torch.Tensor) else v for n, v in host.items()
                if n != "position_ids"}).to(self.device)
        tokens = {n: host[n].repeat_interleave(k, dim=0) if host.get(n) is not None else None
                  for n in ("input_ids", "mm_token_type_ids", "attention_mask")}
        grids = {}
        for name, per_row in (("image_grid_thw", self.images_per_row), ("video_grid_thw", self.videos_per_row),
                              ("second_per_grid_ts", self.videos_per_row)):
            grid = host.get(name)
            if grid is None:
                grids[name] = None
                continue
            chunks = torch.split(torch.as_tensor(grid), list(per_row))
            grids[name] = torch.cat([c for c in chunks for _ in range(k)])
        return build_plan(self.spec, **tokens, **grids).to(self.device)

    def check_model(self, spec: ModelSpec) -> None:
        if spec != self.spec:
            differ = [f"{f.name}={getattr(self.spec, f.name)!r} (model: {getattr(spec, f.name)!r})"
                      for f in dataclasses.fields(spec) if getattr(spec, f.name) != getattr(self.spec, f.name)]
            raise ValueError(
                f"this syncfree plan was built for other model values: {', '.join(differ)}; pass the model "
                "(or its config) to syncfree.prepare()"
            )


def _host(value):
    if isinstance(value, torch.Tensor):
        return value.to("cpu")  # only host tensors reach here; .to("cpu") is then the tensor itself
    return value


def placeholder_runs(row: torch.Tensor, kind: int) -> list[int]:
    """Lengths of the runs of ``kind`` in one row of token types (host tensor)."""
    values, counts = torch.unique_consecutive(row, return_counts=True)
    return counts[values == kind].tolist()


def token_types(spec: ModelSpec, input_ids, mm_token_type_ids) -> torch.Tensor | None:
    """Token types (0 text, 1 image, 2 video) as stock sees placeholders: from input_ids when given."""
    if input_ids is not None and input_ids.dim() == 2:
        return (input_ids == spec.image_token_id).long() + 2 * (input_ids == spec.video_token_id).long()
    if mm_token_type_ids is not None and mm_token_type_ids.dim() == 2:
        return mm_token_type_ids.to(torch.long)
    return None


def build_plan(spec: ModelSpec, *, input_ids=None, mm_token_type_ids=None, attention_mask=None, image_grid_thw=None,
               video_grid_thw=None, second_per_grid_ts=None, feature_attention_mask=None, video_second_per_grid=None,
               position_ids=None, use_audio_in_video: bool = False) -> Plan:
    """Build the plan on the host from host tensors. Checks only what stock also needs (the grids);
    ``syncfree.prepare`` validates the rest before calling this."""
    host = {"input_ids": _host(input_ids), "mm_token_type_ids": _host(mm_token_type_ids),
            "attention_mask": _host(attention_mask), "image_grid_thw": _host(image_grid_thw),
            "video_grid_thw": _host(video_grid_thw), "second_per_grid_ts": _host(second_per_grid_ts),
            "feature_attention_mask": _host(feature_attention_mask), "video_second_per_grid": _host(video_second_per_grid),
            # Given positions (packed batches): kept to answer Transformers' "is this batch packed?" on the host.
            "position_ids": _host(position_ids)}
    types = token_types(spec, host["input_ids"], host["mm_token_type_ids"])
    if types is None:
        raise ValueError("syncfree needs input_ids or mm_token_type_ids of shape (batch, sequence) to plan a forward")
    given_mask = host["attention_mask"]
    # Only a 2D padding mask is planned for; 4D masks and per-layer dicts are the text model's business.
    mask = given_mask if isinstance(given_mask, torch.Tensor) and given_mask.shape == types.shape else None
    image = vision_plan(host["image_grid_thw"], spec, "image_grid_thw") if image_grid_thw is not None else None
    video = vision_plan(host["video_grid_thw"], spec, "video_grid_thw") if video_grid_thw is not None else None

    position_ids = rope_deltas = None
    ids, mm_types = host["input_ids"], host["mm_token_type_ids"]
    if spec.rope_class is not None:  # an Omni thinker: stock's index on the host, the audio encoder's plan
        found = omni_rope(spec, host, mask, bool(use_audio_in_video))
        return Plan(spec=spec, batch_shape=tuple(types.shape), image=image, video=video,
                    n_image_tokens=int((types == 1).sum()), n_video_tokens=int((types == 2).sum()),
                    position_ids=found[0] if found else None, rope_deltas=found[1] if found else None,
                    host_mask=mask, host=host, **omni_fields(spec, host, bool(use_audio_in_video)))
    if (ids is not None and mm_types is not None and ids.shape == mm_types.shape and (image or video)
            and (given_mask is None or mask is not None)):
        try:
            position_ids, rope_deltas = rope_index(ids, mm_types, host["image_grid_thw"], host["video_grid_thw"], mask,
                                                   **spec.rope_options(host["second_per_grid_ts"]))
        except RuntimeError:  # inconsistent grids: stock's own rope index reports it when it runs
            position_ids = rope_deltas = None
    # Images and videos per row, kept to rebuild the plan for an expanded batch (generate with beams).
    images_per_row = tuple(len(placeholder_runs(r, 1)) for r in types)
    frames_per_row = [len(placeholder_runs(r, 2)) for r in types]
    videos_per_row = list(frames_per_row)
    if video is not None and spec.split_video_frames:  # Qwen3-VL: one run per frame
        frames = video.grid_thw[:, 0].cumsum(0).tolist()
        done, videos_per_row = 0, []
        for n in frames_per_row:
            done += n
            videos_per_row.append(sum(1 for f in frames if f <= done) - sum(videos_per_row))
    return Plan(
        spec=spec, batch_shape=tuple(types.shape), image=image, video=video,
        n_image_tokens=int((types == 1).sum()), n_video_tokens=int((types == 2).sum()),
        position_ids=position_ids, rope_deltas=rope_deltas, host_mask=mask,
        host=host, images_per_row=images_per_row, videos_per_row=tuple(videos_per_row),
    )

