"""The host-side plan: everything a multimodal forward derives from its small control tensors, computed once.

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
from .audio_rope import audio_fields, audio_rope
from .checksum import device_weights, host_checksums, weights_length
from .errors import StalePlan, stale
from .hooks import plan_inputs
from .items_per_row import items_per_row, items_per_row_by_count, kept_sizes
from .packing import Packing, packing_from_positions, restarts_without_text_row
from .rope_host import rope_index_host
from .rope_stock import stock_rope_index
from .spec import ModelSpec
from .tensors import DeviceFields, host_array, move
from .token_types import Runs, placeholder_runs, span_types, token_types
from .vision import VisionPlan, vision_plan

__all__ = ["Plan", "Draft", "Runs", "build_plan", "draft_plan", "finish_plan", "plan_inputs", "PLAN_KEY",
           "placeholder_runs", "token_types", "kept_sizes", "span_types", "expanded_inputs", "rows_repeated"]

# Where a plan travels in a batch (``prepare(batch)`` without a device, ``planning_collator``) and in a call.
PLAN_KEY = "syncfree_plan"


# The control inputs a plan is built from: ``hooks.plan_inputs()``, the shared ones and those the registered families
# declare (``PlanHooks.inputs``).


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
    position_ids: torch.Tensor | None  # (axes, B, S), as get_rope_index returns them (3 axes: M-RoPE); or None
    rope_deltas: torch.Tensor | None  # (B, 1)
    host_mask: torch.Tensor | None  # the 2D attention mask (its values as given), on the host; None without one
    host: dict  # the host inputs the plan was built from (kept to rebuild it for an expanded batch)
    images_per_row: tuple[int, ...] = ()
    videos_per_row: tuple[int, ...] = ()
    device: str = "cpu"
    # A family with an audio encoder: its plan, the audio placeholders, and the flag the positions were made for.
    audio: AudioPlan | None = None
    n_audio_tokens: int = 0
    use_audio_in_video: bool = False
    rope_cache: dict = dataclasses.field(default_factory=dict)  # flag -> positions made on demand (the other flag)
    # One keyed checksum per control tensor (``checksum.host_checksums``), then the step, seed and key of the plan's own
    # random weights, so a forward given device tensors can check them against the plan on the device, without a wait
    # (``checksum.assert_given_match``), and the weights once made there (cached: every step of generate() checks).
    checksums: torch.Tensor | None = None
    weights_made: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # The batch's placeholder runs do not match its grids (or a row is all padding): the forward runs stock's
    # own get_rope_index, which fails or places positions its own way (reading the device: only for such batches).
    stock_rope: bool = False
    # Where the tower sees each video frame as its own (1, h, w) grid row: the plan for those rows.
    video_frames: VisionPlan | None = None
    # A family's own index (``PlanHooks.positions``) that leaves positions on the model for the decode steps, (B, 3,
    # steps), and the prompt's length; ``image`` then plans the grids its tower sees.
    decode_position_ids: torch.Tensor | None = None
    prefill_len: int | None = None
    # Counts a traced forward reads, each as the size of an empty host tensor (``dynamic_dims.size_carriers``): a
    # size Dynamo keeps symbolic, where an int attribute would be a constant it guards on (a graph per value).
    carriers: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # ``batch_shape`` as the sizes of an empty (rows, tokens, 0) host tensor, marked like the batch's token dimensions:
    # what a traced forward compares the call's shape with (the ints would make it a graph for one shape).
    shape_carrier: torch.Tensor | None = dataclasses.field(default=None, compare=False, repr=False)
    # Counts a family's hooks take from the host copies for its traced forward (``PlanHooks.fields``: tokens of one
    # kind its blocks route apart, say): ints a graph guards on, one graph per value; or host tables a traced forward
    # hands an operator (marked like the batch's dimensions: ``dynamic_dims``).
    family_counts: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # A padding-free packed batch (``syncfree.packing_collator``): where each row's samples begin and end. The call
    # then gives its positions (each sample's own, restarted), and the text model's masks keep the samples apart.
    packing: Packing | None = None

    _TENSORS = ("position_ids", "rope_deltas", "checksums", "decode_position_ids")
    _NARROW = ("position_ids", "decode_position_ids")
    _PARTS = ("image", "video", "audio", "video_frames", "packing")

    @property
    def n_visual_tokens(self) -> int:
        return self.n_image_tokens + self.n_video_tokens

    @property
    def shape(self) -> tuple:
        """``batch_shape``, as the sizes ``prepare`` gave a traced forward where it made them (``shape_carrier``):
        what a forward compares a call's (rows, tokens) with. Ints there would make a traced graph one shape's."""
        return tuple(self.batch_shape if self.shape_carrier is None else self.shape_carrier.shape[:2])

    def to(self, device) -> "Plan":
        # (Positions made later for the other use_audio_in_video flag are made again on the new device.)
        moved = dataclasses.replace(super().to(device), rope_cache={}, weights_made={})
        if moved.checksums is not None and moved.checksums.device.type != "cpu":
            # The checksum weights are made on the device as the plan arrives there (queued, no wait), not in the
            # forward: the forward's own device work stays stock's or less.
            moved.weights_made["weights"] = device_weights(moved.checksums, weights_length(moved.host))
        return moved

    def pin_memory(self) -> "Plan":
        """The plan with its host tensors in pinned memory. A ``DataLoader`` with ``pin_memory=True`` calls
        this for a plan in a batch (``prepare(batch)`` in a worker), so moving it later does not block."""
        if self.device != "cpu":
            return self
        return super().pin_memory()

    def positions_for_audio_in_video(self, use_audio_in_video) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The 3D positions for this ``use_audio_in_video`` flag, where stock's index interleaves audio and video
        (``RotaryIndex.audio_class``): the plan's own, or made on the host now (no wait)."""
        flag = bool(use_audio_in_video)
        if flag == self.use_audio_in_video:
            return (self.position_ids, self.rope_deltas) if self.position_ids is not None else None
        if flag not in self.rope_cache:
            found = audio_rope(self.spec, self.host, self.host_mask, flag)
            self.rope_cache[flag] = tuple(move(t, self.device) for t in found) if found is not None else None
        return self.rope_cache[flag]

    def given_inputs(self) -> dict:
        """The control inputs the plan was built from, by name (its host copies; None where the batch had none).
        Grid rows the plan makes from a family's other inputs (``PlanHooks.grids``) are not among them."""
        derived = ("image_grid_thw", "video_grid_thw") if self.spec.hooks.grids is not None else ()
        return {name: self.host.get(name) for name in plan_inputs() if name not in derived}

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
        names = plan_inputs()
        self.check_present({**dict.fromkeys(names), **batch})  # (the whole batch: what it lacks, it lacks)
        for name in names:
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
        if self.packing is not None:
            raise ValueError("a packed batch (syncfree.packing_collator) is for training forwards: its rows hold "
                             "several samples each, which generate() cannot expand or continue; pack no batch you "
                             "generate from")
        if rows % own:
            raise ValueError(f"a syncfree plan for {own} rows cannot describe a batch of {rows}")
        k = rows // own
        if self.spec.rope.audio_class is not None:
            # Where stock's index interleaves audio and video, generate() repeats every batch tensor row by row
            # (GenerationMixin's default): the plan describes what the forward will then be given.
            return build_plan(self.spec, use_audio_in_video=self.use_audio_in_video,
                              **rows_repeated(self.host, k)).to(self.device)
        expand = self.spec.hooks.expand or expanded_inputs
        return build_plan(self.spec, **expand(self, k)).to(self.device)

    def check_model(self, spec: ModelSpec) -> None:
        if spec.key != self.spec.key if spec.key is not None and self.spec.key is not None else spec != self.spec:
            differ = [f"{f.name}={getattr(self.spec, f.name)!r} (model: {getattr(spec, f.name)!r})"
                      for f in dataclasses.fields(spec) if getattr(spec, f.name) != getattr(self.spec, f.name)]
            raise ValueError(
                f"this syncfree plan was built for other model values: {', '.join(differ)}; pass the model "
                "(or its config) to syncfree.prepare()"
            )


def rows_repeated(host: dict, k: int) -> dict:
    """The plan's inputs with every tensor repeated row by row, ``k`` times: GenerationMixin's default expansion, for a
    family that keeps it whatever its tensors describe (given positions are left out: generate() makes its own)."""
    return {n: v.repeat_interleave(k, dim=0) if isinstance(v, torch.Tensor) else v for n, v in host.items()
            if n != "position_ids"}


def expanded_inputs(plan: Plan, k: int) -> dict:
    """The inputs of ``plan``'s batch as generate() expands them ``k`` times: per-row inputs repeated row by row, per-item
    inputs (grids) repeated with each row's items; the family's declared ones (``PlanHooks.per_row`` / ``per_item``)
    likewise."""
    host, hooks = plan.host, plan.spec.hooks
    inputs = {n: host[n].repeat_interleave(k, dim=0) if host.get(n) is not None else None
              for n in ("input_ids", "mm_token_type_ids", "attention_mask", *hooks.per_row)}
    per_item = (("image_grid_thw", "image"), ("video_grid_thw", "video"), ("second_per_grid_ts", "video"),
                *hooks.per_item)
    if hooks.grids is not None:  # (grid rows made from the family's own inputs, which are expanded instead)
        per_item = tuple((n, kind) for n, kind in per_item if n not in ("image_grid_thw", "video_grid_thw"))
    counts = {"image": plan.images_per_row, "video": plan.videos_per_row}
    for name, kind in per_item:
        grid = host.get(name)
        if grid is None:
            inputs[name] = None
            continue
        if not counts[kind]:
            raise ValueError(f"a syncfree plan whose {name} items do not end at row ends cannot describe an "
                             "expanded batch")
        chunks = torch.split(torch.as_tensor(grid), list(counts[kind]))
        inputs[name] = torch.cat([c for c in chunks for _ in range(k)])
    return inputs


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
    video_frames: VisionPlan | None = None  # (VideoLayout.frames_as_images: the tower's per-frame grid rows)

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
        if self.spec.video.frames_as_images and self.spec.video_span_ids is None and ids is not None and ids.dim() == 2:
            return int(np.count_nonzero(host_array(ids) == self.spec.image_token_id))
        return None


def draft_plan(spec: ModelSpec, **inputs) -> Draft:
    """Host copies, token types, runs and vision plans (checks only what stock also needs: the grids). ``inputs``: the
    control inputs by name (``plan_inputs()``; a missing one is None)."""
    names = plan_inputs()
    unknown = [name for name in inputs if name not in names]
    if unknown:
        raise TypeError(f"draft_plan() got an unexpected keyword argument {unknown[0]!r}")
    # (Given positions, of packed batches, are kept to answer Transformers' "is this batch packed?" on the host.)
    host = {name: _host(inputs.get(name)) for name in names}
    image_grid_thw, video_grid_thw = host["image_grid_thw"], host["video_grid_thw"]
    if spec.hooks.grids is not None:  # (grid rows made from the family's own inputs)
        image_grid_thw, video_grid_thw = spec.hooks.grids(host)
        host["image_grid_thw"], host["video_grid_thw"] = image_grid_thw, video_grid_thw
    types = token_types(spec, host["input_ids"], host["mm_token_type_ids"])
    if types is None:
        raise ValueError("syncfree needs input_ids or mm_token_type_ids of shape (batch, sequence) to plan a forward")
    given_mask = host["attention_mask"]
    # Only a 2D padding mask is planned for; 4D masks and per-layer dicts are the text model's business.
    mask = given_mask if isinstance(given_mask, torch.Tensor) and given_mask.shape == types.shape else None
    tower_grid = host["image_grid_thw"]
    if spec.hooks.tower_grid is not None:  # (the grids the tower sees are not all the given ones)
        image_grid_thw = tower_grid = spec.hooks.tower_grid(spec, host, int(np.count_nonzero(types == 1)))
    # (Per-item merge sizes: passed only where given, so other families' calls stay as they were.)
    merges = {kind: {"merge_sizes": host.get(f"{kind}_merge_sizes")} if host.get(f"{kind}_merge_sizes") is not None
              else {} for kind in ("image", "video")}
    # (Named in messages as the batch names them: a family's own grid inputs, PlanHooks.grid_inputs.)
    names = spec.hooks.grid_inputs if spec.hooks.grids is not None else ("image_grid_thw", "video_grid_thw")
    image = (vision_plan(tower_grid, spec, names[0], **merges["image"])
             if image_grid_thw is not None else None)
    video = (vision_plan(host["video_grid_thw"], spec, names[1], spec.video_temporal_merge, **merges["video"])
             if video_grid_thw is not None else None)
    frames = None
    if video is not None and spec.video.frames_as_images:  # the tower is handed one (1, h, w) row per frame
        grid = host_array(video.grid_thw)
        rows = np.repeat(grid, grid[:, 0], axis=0)
        rows[:, 0] = 1
        frames = vision_plan(torch.from_numpy(rows), spec, "video_grid_thw")
    return Draft(spec, host, types, mask, placeholder_runs(types), image, video, frames)


def build_plan(spec: ModelSpec, *, use_audio_in_video: bool = False, **inputs) -> Plan:
    """Build the plan on the host from host tensors (``plan_inputs()``). Checks only what stock also needs (the
    grids); ``syncfree.prepare`` validates the rest on the draft before finishing it."""
    return finish_plan(draft_plan(spec, **inputs), use_audio_in_video)


def finish_plan(draft: Draft, use_audio_in_video: bool = False, packing: Packing | None = None) -> Plan:
    """The rest of the plan: 3D positions (or stock's audio index and the audio encoder's plan), items per row,
    checksums. ``packing``: a packed batch's segments; its call gives each sample's own positions, so none are made
    for the rows."""
    spec, host, types, mask = draft.spec, draft.host, draft.types, draft.mask
    # (A padding-free packed batch made elsewhere: its text row says so. With a mask of its own, 4D or per layer,
    # stock reads no packed samples from the positions: their restarts are the padding's.)
    if packing is None and mask is None and host.get("attention_mask") is None:
        packing = packing_from_positions(host.get("position_ids"), tuple(types.shape))
        if packing is None and spec.rope.mrope and restarts_without_text_row(host.get("position_ids"), tuple(types.shape)):
            raise ValueError("position_ids restart inside a row but have no text row: a padding-free packed batch "
                             "whose samples' boundaries nothing can read (stock attends across them); give 4-row "
                             "position_ids, the text positions first (syncfree.packing_collator makes them)")
    if packing is not None:
        if tuple(packing.batch_shape) != tuple(types.shape):
            raise ValueError(f"the packing describes a batch of shape {packing.batch_shape} but the tokens have "
                             f"{tuple(types.shape)}")
        position_ids, rope_deltas = None, None
        extra = dict(items_per_row(spec, draft.runs, draft.video) if spec.rope.mrope
                     else items_per_row_by_count(draft.runs, draft.image, draft.video, draft.host), packing=packing)
    elif spec.rope.audio_class is not None:  # audio and video interleaved: stock's index on the host, the audio plan
        found = audio_rope(spec, host, mask, bool(use_audio_in_video))
        position_ids, rope_deltas = found if found else (None, None)
        extra = audio_fields(spec, host, bool(use_audio_in_video))
    elif spec.hooks.positions is not None:  # the family's own index on the host (and what it leaves for decoding)
        extra = spec.hooks.positions(spec, host)
        position_ids, rope_deltas = extra.pop("position_ids"), extra.pop("rope_deltas")
        extra.update(items_per_row(spec, draft.runs, draft.video))
    else:
        position_ids, rope_deltas, stock_rope = _mrope_index(spec, host, mask, draft.image or draft.video, draft.runs)
        extra = dict(items_per_row(spec, draft.runs, draft.video) if spec.rope.mrope
                     else items_per_row_by_count(draft.runs, draft.image, draft.video, draft.host),
                     stock_rope=stock_rope)
        if spec.audio_token_id is not None and host["input_ids"] is not None:  # (audio placeholders without an audio plan)
            extra["n_audio_tokens"] = int((host["input_ids"] == spec.audio_token_id).sum())
    if spec.hooks.fields is not None:  # (what the family adds: its audio encoder's plan)
        extra.update(spec.hooks.fields(spec, host))
    return Plan(
        spec=spec, batch_shape=tuple(types.shape), image=draft.image, video=draft.video,
        n_image_tokens=draft.stock_count(1), n_video_tokens=draft.stock_count(2), video_frames=draft.video_frames,
        position_ids=position_ids, rope_deltas=rope_deltas, host_mask=mask, host=host, checksums=host_checksums(host),
        **extra,
    )


def _mrope_index(spec: ModelSpec, host: dict, mask, has_vision, runs: Runs | None = None) -> tuple:
    """The shared 3D rotary index (M-RoPE: ``rope_host.rope_index_host``, or the family's own host index), where
    stock's would compute one: (positions, deltas, False); Nones where none is computed; (None, None, True) where
    only stock's own index gives stock's answer (runs that do not match their grids, a row with no kept token: stock
    fails or places positions its own way)."""
    ids, mm_types, given_mask = host["input_ids"], host["mm_token_type_ids"], host["attention_mask"]
    if ids is not None and ids.dtype != torch.long and has_vision and (spec.rope.mrope or spec.rope.host_class is not None):
        # Stock's index makes its positions in the ids' dtype and writes int64 ones into them: int32 ids fail there
        # (PyTorch's "Index put requires the source and destination dtypes match") or give int32 positions. Only
        # stock's own index gives stock's answer, or its error.
        return None, None, True
    # (A host index of the family's own places positions even where the plan's runs carry no meaning.)
    if ((spec.rope.mrope or spec.rope.host_class is not None) and ids is not None and mm_types is not None
            and ids.shape == mm_types.shape and has_vision and (given_mask is None or mask is not None)):
        if spec.rope.host_class is not None:  # the family's own index, as stock, on the host
            # (Its NumPy form where the family declares one and it models the layout: stock's walk costs milliseconds.)
            found = spec.hooks.rope_index(spec, host, mask, runs=runs) if spec.hooks.rope_index is not None else None
            if found is not None:
                return (*found, False)
            try:
                return (*stock_rope_index(spec.vision_module, spec.rope.host_class, spec.config, input_ids=ids,
                                          mm_token_type_ids=mm_types, image_grid_thw=host["image_grid_thw"],
                                          video_grid_thw=host["video_grid_thw"], attention_mask=mask,
                                          **{n: host[n] for n in spec.hooks.inputs}), False)
            # Stock's own index raises the same on the device (e.g. a grid iterator run dry or absent).
            except (RuntimeError, ValueError, StopIteration, TypeError, IndexError):
                return None, None, True
        try:
            return (*rope_index_host(ids, mm_types, host["image_grid_thw"], host["video_grid_thw"], mask,
                                     **spec.rope_options(host["second_per_grid_ts"])), False)
        except RuntimeError:
            return None, None, True
    return None, None, False
