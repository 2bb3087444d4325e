"""The host-side plan: everything a Qwen-VL forward derives from its small control tensors, computed once.

``grid_thw``, ``input_ids``, ``mm_token_type_ids`` and ``attention_mask`` come
out of the processor on the CPU. Everything the forward needs from them for
control flow (segment lengths and split sizes as Python ints, the maximum
segment length) or for indexing (cumulative lengths, placeholder counts, 3D
rotary positions) is computed here, on the host, once (``draft_plan`` then
``finish_plan``; ``validate`` checks the draft), in NumPy: the work grows with
images, frames and tokens, not patches. What grows with patches (rotary ids,
interpolation taps, window order) is made later on the device from the grid
rows (``vision_tables``). ``Plan.to(device)`` moves the tensors with pinned,
non-blocking copies; the Python ints stay on the host, where the patched
forward reads them without ever asking the device.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch

from .audio import AudioPlan
from .audio_chunks import expanded_chunk_lengths
from .audio_mask import masked_audio_plan
from .checksum import host_checksums
from .errors import StalePlan, stale
from .items_per_row import items_per_row, items_per_row_by_count, kept_sizes
from .omni import omni_fields, omni_rope
from .rope_host import rope_index_host
from .rope_stock import stock_rope_index
from .spec import ModelSpec
from .target_grids import expanded_inputs, source_grids, target_grid_rope
from .tensors import DeviceFields, host_array, move
from .token_types import Runs, placeholder_runs, span_types, token_types
from .vision import VisionPlan, vision_plan

__all__ = ["Plan", "Draft", "Runs", "build_plan", "draft_plan", "finish_plan", "PLAN_INPUTS", "PLAN_KEY",
           "placeholder_runs", "token_types", "kept_sizes", "span_types"]

# Where a plan travels in a batch (``prepare(batch)`` without a device, ``planning_collator``) and in a call.
PLAN_KEY = "syncfree_plan"


# (``moe_mm_token_type_ids``: ERNIE-4.5-VL's MoE routes each token to text or vision experts by it; the plan keeps a
# host copy so the MoE blocks know how many tokens each kind has without asking the device.)
PLAN_INPUTS = ("input_ids", "mm_token_type_ids", "attention_mask", "image_grid_thw", "video_grid_thw",
               "second_per_grid_ts", "feature_attention_mask", "video_second_per_grid", "position_ids",
               "moe_mm_token_type_ids", "image_merge_sizes", "video_merge_sizes", "video_compression_mask",
               "input_values_mask", "target_sizes", "target_sizes_videos", "input_features_mask",
               "images_per_sample", "chunk_sample_lengths")
# (``input_features_mask``: Qwen3-ASR's real mel frames per clip, which lay out its audio encoder's windows and valid
# frames: ``plan.audio_mask``.)
# (``chunk_sample_lengths``: dots3-note's samples per packed audio chunk, which give the frames each chunk keeps.)
# (``input_values_mask``: Muse Spark's real audio samples per clip, which give the audio tokens each clip keeps.)
# (``image_merge_sizes`` / ``video_merge_sizes``: VideoLLaMA3's merge size per image or video, which its tower reads
# per item; ``video_compression_mask``: the video features it keeps. Host copies, so neither the tower's loop nor the
# selection of the kept features reads the device. ``target_sizes`` / ``target_sizes_videos``: MiniCPM-V's (h, w) per
# crop, its grids (``Layout.target_sizes``): host copies for the tower's cumulative lengths and the merger's loop.
# ``images_per_sample``: GLM-Image's grid rows per sample, its sources and then its targets: ``Layout.target_grids``.)


@dataclass
class Plan(DeviceFields):
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
    position_ids: torch.Tensor | None  # (axes, B, S), as get_rope_index returns them (3 axes in Qwen-VL); or None
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
    # One keyed checksum per control tensor (``checksum.CHECKED``), then the plan's own random weights, so a forward
    # given device tensors can check them against the plan on the device, without a wait
    # (``checksum.assert_given_match``).
    checksums: torch.Tensor | None = None
    # The batch's placeholder runs do not match its grids (or a row is all padding): the forward runs stock's
    # own get_rope_index, which fails or places positions its own way (reading the device: only for such batches).
    stock_rope: bool = False
    # Where the tower sees each video frame as its own (1, h, w) grid row (GLM-4.1V): the plan for those rows.
    video_frames: VisionPlan | None = None
    # GLM-Image (``Layout.target_grids``): what its index leaves on the model for the decode steps, (B, 3, steps) and
    # the prompt's length; ``image`` plans the source grids, the ones its tower sees.
    decode_position_ids: torch.Tensor | None = None
    prefill_len: int | None = None

    _TENSORS = ("position_ids", "rope_deltas", "checksums", "decode_position_ids")
    _PARTS = ("image", "video", "audio", "video_frames")

    @property
    def n_visual_tokens(self) -> int:
        return self.n_image_tokens + self.n_video_tokens

    def to(self, device) -> "Plan":
        # (Positions made later for the other Omni flag are made again on the new device.)
        return dataclasses.replace(super().to(device), rope_cache={})

    def pin_memory(self) -> "Plan":
        """The plan with its host tensors in pinned memory. A ``DataLoader`` with ``pin_memory=True`` calls
        this for a plan in a batch (``prepare(batch)`` in a worker), so moving it later does not block."""
        if self.device != "cpu":
            return self
        return super().pin_memory()

    def omni_positions(self, use_audio_in_video) -> tuple[torch.Tensor, torch.Tensor] | None:
        """An Omni thinker's 3D positions for this flag (the plan's own, or made on the host now: no wait)."""
        flag = bool(use_audio_in_video)
        if flag == self.use_audio_in_video:
            return (self.position_ids, self.rope_deltas) if self.position_ids is not None else None
        if flag not in self.rope_cache:
            found = omni_rope(self.spec, self.host, self.host_mask, flag)
            self.rope_cache[flag] = tuple(move(t, self.device) for t in found) if found is not None else None
        return self.rope_cache[flag]

    def given_inputs(self) -> dict:
        """The control inputs the plan was built from, by name (its host copies; None where the batch had none).
        MiniCPM-V's grid rows, which the plan makes from its target sizes, are not among them."""
        derived = ("image_grid_thw", "video_grid_thw") if self.spec.target_sizes else ()
        return {name: self.host.get(name) for name in PLAN_INPUTS if name not in derived}

    def check_present(self, given: dict) -> None:
        """Raise ``StalePlan`` naming the first control input that the plan was built from and ``given`` holds as
        None (removed), or that ``given`` holds and the plan was built without (added). A name missing from ``given``
        is not looked at (a forward that does not take it, or whose caller does not pass it on)."""
        for name, kept in self.given_inputs().items():
            if name not in given:
                continue
            value = given.get(name)
            if kept is not None and value is None:
                raise StalePlan(stale(name, "was removed (or set to None)"))
            if kept is None and value is not None:
                raise StalePlan(stale(name, "was added"))

    def check_batch(self, batch) -> None:
        """Refuse a batch this plan was not built from (sliced, packed or edited after ``prepare()``, or a control
        tensor removed or added).

        Compares the host inputs the plan keeps with the batch's (host tensors: no sync)."""
        self.check_present({**dict.fromkeys(PLAN_INPUTS), **batch})  # (the whole batch: what it lacks, it lacks)
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
        if self.spec.target_grids:  # (GLM-Image: generate() repeats its grids row by row too)
            return build_plan(self.spec, **expanded_inputs(host, k)).to(self.device)
        if self.spec.rope_class is not None:
            # An Omni thinker's generate() repeats every batch tensor row by row (GenerationMixin's default):
            # the plan describes what the forward will then be given.
            return build_plan(self.spec, use_audio_in_video=self.use_audio_in_video, **{
                n: v.repeat_interleave(k, dim=0) if isinstance(v, torch.Tensor) else v for n, v in host.items()
                if n != "position_ids"}).to(self.device)
        tokens = {n: host[n].repeat_interleave(k, dim=0) if host.get(n) is not None else None
                  for n in ("input_ids", "mm_token_type_ids", "attention_mask", "moe_mm_token_type_ids")}
        # (generate() repeats the compression mask value by value, as every other tensor of its inputs.)
        tokens["video_compression_mask"] = (host["video_compression_mask"].repeat_interleave(k, dim=0)
                                            if host.get("video_compression_mask") is not None else None)
        if host.get("input_values_mask") is not None:  # (Muse Spark: one row per clip, repeated as the batch rows)
            tokens["input_values_mask"] = host["input_values_mask"].repeat_interleave(k, dim=0)
        if host.get("input_features_mask") is not None:  # (Qwen3-ASR: the same, one clip per row)
            tokens["input_features_mask"] = host["input_features_mask"].repeat_interleave(k, dim=0)
        if host.get("chunk_sample_lengths") is not None and host.get("input_ids") is not None:
            # (dots3-note: each row's audio chunks repeated, row after row, as its generate() repeats them)
            tokens["chunk_sample_lengths"] = expanded_chunk_lengths(
                host["chunk_sample_lengths"], host["input_ids"], self.spec.audio_token_id, self.spec.samples_per_token, k)
        grids = {}
        for name, per_row in (("image_grid_thw", self.images_per_row), ("video_grid_thw", self.videos_per_row),
                              ("second_per_grid_ts", self.videos_per_row), ("image_merge_sizes", self.images_per_row),
                              ("video_merge_sizes", self.videos_per_row), ("target_sizes", self.images_per_row),
                              ("target_sizes_videos", self.videos_per_row)):
            grid = host.get(name)
            if grid is None:
                grids[name] = None
                continue
            if not per_row:
                raise ValueError(f"a syncfree plan whose {name} items do not end at row ends cannot describe an "
                                 "expanded batch")
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
    """A private host copy (only host tensors reach here). Never the caller's tensor itself: the registry keys
    that tensor weakly (a plan holding it would keep it, and its entry, alive forever), and a staleness check
    against the very same object would compare it with itself. The control tensors are small."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.device.type == "cpu" and value.dtype in _NUMPY_DTYPES and not value.is_conj() and not value.is_neg():
            # Copied by NumPy: a PyTorch copy of a 32k-token tensor fans out over intra-op threads, which on a
            # busy host waits for them (the plan's time doubled under load).
            return torch.from_numpy(value.numpy().copy())
        return value.to("cpu", copy=True)
    return value


_NUMPY_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float32,
                 torch.float64, torch.float16)


@dataclass
class Draft:
    """The first half of a plan, made once per batch: private host copies, token types, placeholder runs and
    vision plans. ``validate`` checks a batch on it; ``finish_plan`` completes it."""

    spec: ModelSpec
    host: dict
    types: np.ndarray  # (B, S) int64
    mask: torch.Tensor | None  # the 2D padding mask (host copy), None without one or of another shape
    runs: Runs
    image: VisionPlan | None
    video: VisionPlan | None
    video_frames: VisionPlan | None = None  # (Layout.video_frames_as_images: the tower's per-frame grid rows)

    def count(self, kind: int) -> int:
        """Placeholders of ``kind`` in the tokens (every position, masked or not: stock counts them so)."""
        return int(self.runs.lengths[self.runs.kinds == kind].sum())

    def stock_count(self, kind: int) -> int:
        """What stock's get_placeholder_mask counts for ``kind``: where video frames are written with the image
        placeholder, both kinds count every image placeholder (so a batch with both fails stock's check)."""
        shared = self._image_placeholders
        return self.count(kind) if shared is None else shared

    @functools.cached_property
    def _image_placeholders(self) -> int | None:
        """The image placeholders in input_ids where video frames use them too (counted once), else None."""
        ids = self.host["input_ids"]
        if self.spec.video_frames_as_images and self.spec.video_span_ids is None and ids is not None and ids.dim() == 2:
            return int(np.count_nonzero(host_array(ids) == self.spec.image_token_id))
        return None


def draft_plan(spec: ModelSpec, *, input_ids=None, mm_token_type_ids=None, attention_mask=None, image_grid_thw=None,
               video_grid_thw=None, second_per_grid_ts=None, feature_attention_mask=None, video_second_per_grid=None,
               position_ids=None, moe_mm_token_type_ids=None, image_merge_sizes=None, video_merge_sizes=None,
               video_compression_mask=None, input_values_mask=None, target_sizes=None,
               target_sizes_videos=None, input_features_mask=None,
               images_per_sample=None, chunk_sample_lengths=None) -> Draft:
    """Host copies, token types, runs and vision plans (checks only what stock also needs: the grids)."""
    host = {"input_ids": _host(input_ids), "mm_token_type_ids": _host(mm_token_type_ids),
            "attention_mask": _host(attention_mask), "image_grid_thw": _host(image_grid_thw),
            "video_grid_thw": _host(video_grid_thw), "second_per_grid_ts": _host(second_per_grid_ts),
            "feature_attention_mask": _host(feature_attention_mask), "video_second_per_grid": _host(video_second_per_grid),
            # Given positions (packed batches): kept to answer Transformers' "is this batch packed?" on the host.
            "position_ids": _host(position_ids), "moe_mm_token_type_ids": _host(moe_mm_token_type_ids),
            "image_merge_sizes": _host(image_merge_sizes), "video_merge_sizes": _host(video_merge_sizes),
            "video_compression_mask": _host(video_compression_mask), "target_sizes": _host(target_sizes),
            "target_sizes_videos": _host(target_sizes_videos),
            "input_values_mask": _host(input_values_mask), "input_features_mask": _host(input_features_mask),
            "images_per_sample": _host(images_per_sample),
            "chunk_sample_lengths": _host(chunk_sample_lengths)}
    if spec.target_sizes:  # (MiniCPM-V: each (h, w) crop is the grid row (1, h, w))
        image_grid_thw, video_grid_thw = (_navit_grid(host[name], name) for name in ("target_sizes", "target_sizes_videos"))
        host["image_grid_thw"], host["video_grid_thw"] = image_grid_thw, video_grid_thw
    types = token_types(spec, host["input_ids"], host["mm_token_type_ids"])
    if types is None:
        raise ValueError("syncfree needs input_ids or mm_token_type_ids of shape (batch, sequence) to plan a forward")
    given_mask = host["attention_mask"]
    # Only a 2D padding mask is planned for; 4D masks and per-layer dicts are the text model's business.
    mask = given_mask if isinstance(given_mask, torch.Tensor) and given_mask.shape == types.shape else None
    tower_grid = host["image_grid_thw"]
    if spec.target_grids:  # (GLM-Image: the tower's grids are the sources)
        image_grid_thw = tower_grid = source_grids(spec, host, int(np.count_nonzero(types == 1)))
    # (Per-item merge sizes, VideoLLaMA3's: passed only where given, so other families' calls stay as they were.)
    merges = {kind: {"merge_sizes": host[f"{kind}_merge_sizes"]} if host[f"{kind}_merge_sizes"] is not None else {}
              for kind in ("image", "video")}
    image = (vision_plan(tower_grid, spec, "image_grid_thw", **merges["image"])
             if image_grid_thw is not None else None)
    video = (vision_plan(host["video_grid_thw"], spec, "video_grid_thw", spec.video_temporal_merge, **merges["video"])
             if video_grid_thw is not None else None)
    frames = None
    if video is not None and spec.video_frames_as_images:  # the tower is handed one (1, h, w) row per frame
        grid = host_array(video.grid_thw)
        rows = np.repeat(grid, grid[:, 0], axis=0)
        rows[:, 0] = 1
        frames = vision_plan(torch.from_numpy(rows), spec, "video_grid_thw")
    return Draft(spec, host, types, mask, placeholder_runs(types), image, video, frames)


def _navit_grid(sizes, name: str):
    """NaViT ``(N, 2)`` crop sizes as ``(N, 3)`` grid rows ``(1, h, w)`` (host tensors; None stays None)."""
    if sizes is None:
        return None
    if not isinstance(sizes, torch.Tensor) or sizes.dim() != 2 or sizes.shape[1] != 2:
        raise ValueError(f"{name} must have shape (N, 2), got {tuple(getattr(sizes, 'shape', ()))}")
    return torch.nn.functional.pad(sizes, (1, 0), value=1)


def build_plan(spec: ModelSpec, *, use_audio_in_video: bool = False, **inputs) -> Plan:
    """Build the plan on the host from host tensors (``PLAN_INPUTS``). Checks only what stock also needs (the
    grids); ``syncfree.prepare`` validates the rest on the draft before finishing it."""
    return finish_plan(draft_plan(spec, **inputs), use_audio_in_video)


def finish_plan(draft: Draft, use_audio_in_video: bool = False) -> Plan:
    """The rest of the plan: 3D positions (or the Omni thinkers' pieces), items per row, checksums."""
    spec, host, types, mask = draft.spec, draft.host, draft.types, draft.mask
    if spec.rope_class is not None:  # an Omni thinker: stock's index on the host, the audio encoder's plan
        found = omni_rope(spec, host, mask, bool(use_audio_in_video))
        position_ids, rope_deltas = found if found else (None, None)
        extra = omni_fields(spec, host, bool(use_audio_in_video))
    elif spec.target_grids:  # GLM-Image: stock's own index on the host, with its decode positions
        extra = target_grid_rope(spec, host)
        position_ids, rope_deltas = extra.pop("position_ids"), extra.pop("rope_deltas")
        extra.update(items_per_row(spec, draft.runs, draft.video))
    else:
        position_ids, rope_deltas, stock_rope = _qwen_vl_rope(spec, host, mask, draft.image or draft.video)
        extra = dict(items_per_row(spec, draft.runs, draft.video) if spec.mrope
                     else items_per_row_by_count(draft.runs, draft.image, draft.video, draft.host),
                     stock_rope=stock_rope)
        if spec.audio_token_id is not None and host["input_ids"] is not None:  # (Muse Spark's audio placeholders)
            extra["n_audio_tokens"] = int((host["input_ids"] == spec.audio_token_id).sum())
        if spec.audio_encoder is not None and host["input_features_mask"] is not None:  # (Qwen3-ASR's encoder)
            extra["audio"] = masked_audio_plan(host["input_features_mask"], spec.vision_module, *spec.audio_encoder)
    return Plan(
        spec=spec, batch_shape=tuple(types.shape), image=draft.image, video=draft.video,
        n_image_tokens=draft.stock_count(1), n_video_tokens=draft.stock_count(2), video_frames=draft.video_frames,
        position_ids=position_ids, rope_deltas=rope_deltas, host_mask=mask, host=host, checksums=host_checksums(host),
        **extra,
    )


def _qwen_vl_rope(spec: ModelSpec, host: dict, mask, has_vision) -> tuple:
    """syncfree's Qwen2-VL-style index, where stock's would compute one: (positions, deltas, False); Nones where
    none is computed; (None, None, True) where only stock's own index gives stock's answer (runs that do not
    match their grids, a row with no kept token: stock fails or places positions its own way)."""
    ids, mm_types, given_mask = host["input_ids"], host["mm_token_type_ids"], host["attention_mask"]
    # (A host index of the family's own places positions even where the plan's runs carry no meaning: MiniCPM-V 4.7.)
    if ((spec.mrope or spec.host_rope_class is not None) and ids is not None and mm_types is not None
            and ids.shape == mm_types.shape and has_vision and (given_mask is None or mask is not None)):
        if spec.host_rope_class is not None:  # the family's own index (HunYuan-VL's), as stock, on the host
            try:
                return (*stock_rope_index(spec.vision_module, spec.host_rope_class, spec.config, input_ids=ids,
                                          mm_token_type_ids=mm_types, image_grid_thw=host["image_grid_thw"],
                                          video_grid_thw=host["video_grid_thw"], attention_mask=mask,
                                          target_sizes=host["target_sizes"],
                                          target_sizes_videos=host["target_sizes_videos"]), False)
            # Stock's own index raises the same on the device (MiniCPM-V 4.7's: a grid iterator run dry or absent).
            except (RuntimeError, ValueError, StopIteration, TypeError, IndexError):
                return None, None, True
        try:
            return (*rope_index_host(ids, mm_types, host["image_grid_thw"], host["video_grid_thw"], mask,
                                     **spec.rope_options(host["second_per_grid_ts"])), False)
        except RuntimeError:
            return None, None, True
    return None, None, False
