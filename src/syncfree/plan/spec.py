"""What a plan depends on: a family's input layout (``Layout``, registered by ``syncfree.families``) and
the model's values that the plan is made from (``ModelSpec``, checked against the model at forward time)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass

import torch

from .hooks import SHARED_INPUTS, PlanHooks
from .registry import REGISTRY
from .rope_stock import host_rope_key, rope_config_key

__all__ = ["Layout", "PositionTable", "ModelSpec", "multimodal_config", "register_layout", "supported_model_types",
           "layout_of", "vision_merge_size", "register_assumed_spec", "assumed_spec"]


@dataclass(frozen=True)
class PositionTable:
    """A vision tower's learned position table, which stock resamples to each grid (the plan makes the taps): how the
    family's tower reads it. Declared by the family (``Layout(table=PositionTable(...))``)."""

    # Where its side comes from: ``num_position_embeddings`` (its square root), ``image_size`` (image_size //
    # patch_size), or the vision config attribute that holds it.
    side: str = "num_position_embeddings"
    # The class whose ``self.interpolation_align_corners = ...`` says how it is resampled (it changed between
    # releases); None: align_corners=True, the helpers' fixed choice where no class says.
    align_corners_from: str | None = None
    mode: str = "bilinear"  # stock's interpolation mode (``mode=``: "bicubic" takes 16 taps)
    swap_hw: bool = False  # read at (w, h) (stock's helper takes ``grid_thw[:, [0, 2, 1]]``)
    padding: str = "border"  # outside the table: the border's values, or zeros


@dataclass(frozen=True)
class Layout:
    """How a family lays out its inputs: what the plan and the rope index need to know about it."""

    modeling: str  # the Transformers modeling module holding the family's classes and vision helpers
    table: PositionTable | None = None  # a learned position table in the vision tower, resampled to each grid
    frames_as_runs: bool = False  # each video frame is its own placeholder run, timestamps between
    windows: bool = False  # window attention in the vision tower
    video_time_scale: bool = False  # video positions step by tokens_per_second * seconds
    # An audio encoder, and a rotary index interleaving audio and video by time that the plan runs as stock on the
    # host (defined on this class).
    audio: bool = False
    rope_class: str | None = None
    # 3D rotary positions (M-RoPE) from a get_rope_index; False: the text model numbers tokens 0..S-1 itself, so
    # the plan computes no positions and placeholder runs carry no meaning.
    mrope: bool = True
    # The processor's markers around each image or video (the config's ids); False where the chat template
    # writes them and the config names none.
    vision_markers: bool = True
    # The processor returns (and the forward takes) mm_token_type_ids.
    token_types: bool = True
    # Video frames are written with the image placeholder and typed 2 only by mm_token_type_ids; stock counts
    # "video" placeholders as image tokens, and the tower sees each frame as its own (1, h, w) grid row.
    video_frames_as_images: bool = False
    # The module holding the vision tower, where it is not the family's own (a family that runs another's tower).
    vision_modeling: str | None = None
    # A tower that merges patches only after its encoder (its helpers take this merge, 1; its learned table is
    # image_size // patch_size on a side).
    tower_merge: int | None = None
    pixels_4d: bool = False  # the processor's pixels are (patches, channels, patch, patch)
    # The tower ends in the projector to the text width (its merger); False where a projector outside it follows:
    # vision_every_step's one-unit tower pass would not reach that projector.
    tower_holds_projector: bool = True
    # Video frames are merged in groups of ``vision_config.temporal_merge_size`` after the tower (a resampler): a
    # video's placeholders and its temporal positions count t // that size frames.
    video_temporal_merge: bool = False
    # Each image and video comes with its own spatial merge size, a forward input (``image_merge_sizes`` /
    # ``video_merge_sizes``) instead of a config value: the plan keeps them on the host per item.
    item_merge_sizes: bool = False
    # A rotary index of the family's own that the plan runs as stock on the host (``rope_stock.stock_rope_index``):
    # the class defining it. Unlike ``rope_class``, a batch of text, images and videos (no audio).
    host_rope_class: str | None = None
    # Placeholders beyond the merged patches: tokens the merger appends to each merged row (a newline column: 1) and
    # to each image (begin and end embeddings: 2).
    row_extra_tokens: int = 0
    item_extra_tokens: int = 0
    # The tower attends over each image or video as one segment (stock's ``merge_temporal=True``), not frame by frame;
    # and its rotary ids carry the frame, (t, row, col) (``include_temporal=True``).
    clip_segments: bool = False
    temporal_position_ids: bool = False
    # The tower prepends a class token to each attention segment (each frame) before its blocks and drops them before
    # its merger: the attention splits segments one token longer than their patches, and stock's
    # ``get_vision_frame_lengths`` takes the per-frame patch counts from the plan (``frame_lengths``).
    segment_class_token: bool = False
    # Video frames are image placeholders that lie between the config's video start and end ids: the
    # plan types tokens by those spans from input_ids (stock's get_placeholder_mask does, and counts the two kinds
    # apart), not from mm_token_type_ids. With video_frames_as_images for the tower's per-frame grid rows.
    video_spans: bool = False
    # The vision config's name for its merge; windows as many patches on a side as the position table; a pixel
    # shuffle by the merge after the encoder (``TableSpec.shuffle``).
    merge_attr: str = "spatial_merge_size"
    window_from_table: bool = False
    pixel_shuffle: bool = False
    # Audio placeholders (``config.audio_token_id``) the plan counts, without an audio encoder's plan (``audio``).
    audio_tokens: bool = False
    # A tower with a ``merge_kernel_size`` (h, w) instead of ``spatial_merge_size`` that, after its encoder, averages
    # each clip's frames onto one frame's merged tokens (a grid row yields h*w/merge**2 tokens whatever its
    # t), and it adds a frame embedding per patch: the plan's split sizes ignore t, and it makes the frame index and
    # the pooling's destination and weight (``TableSpec.pool``).
    temporal_pooling: bool = False
    # The whole prepared forward traces as one graph (``torch.compile(fullgraph=True)``): the wrappers hand a traced
    # call the plan (``rewrite.wrappers.traced_entry``). Only where that was shown (tests/test_one_graph.py); elsewhere a
    # traced call runs stock's code, breaks and all.
    one_graph: bool = False
    # And one graph serves a stream of layouts: ``prepare`` marks the per-item sizes unbacked for Dynamo and hands the
    # traced forward its counts as sizes (``plan.dynamic_dims``). Only where that was shown (tests/test_compile_stream.py);
    # elsewhere those sizes are marked dynamic (Dynamo may still specialize them) and the counts are constants.
    stream: bool = False
    # Padding-free packed batches (``syncfree.packing_collator``): "" where the patched forward keeps the samples of a
    # packed row apart (each sample's logits are its own run's: tests/test_packing.py); else why it cannot, in the
    # one-line refusal that names the family.
    packing_refused: str = ("syncfree has not shown that its forward keeps the samples of a packed row apart (its "
                            "masks, states and merges were not checked per sample)")
    # What the family adds to the shared plan (its inputs, grids, positions, fields): ``hooks.PlanHooks``.
    plan: PlanHooks = PlanHooks()


# model_type -> Layout: ``REGISTRY.layouts``, filled by ``syncfree.families`` (one entry per fully supported family)
# when syncfree is imported: the plan knows families only through that table, so it never imports the layer above it.
def register_layout(model_type: str, layout: Layout) -> None:
    """Register ``layout`` for ``model_type``, and the control inputs its ``PlanHooks`` declare."""
    REGISTRY.add_layout(model_type, layout, SHARED_INPUTS)


def multimodal_config(model):
    """The config of ``model`` that holds a vision config: its own, else the first module's that does (a vision tower
    alone, a PEFT wrapper); a config passed as the model is itself; None for None or a ``ModelSpec``."""
    if model is None or isinstance(model, ModelSpec):
        return None
    config = getattr(model, "config", model)
    if hasattr(config, "vision_config"):
        return config
    for module in getattr(model, "modules", lambda: [])():
        if hasattr(getattr(module, "config", None), "vision_config"):
            return module.config
    return config


def supported_model_types() -> tuple[str, ...]:
    return tuple(REGISTRY.layouts)


def layout_of(model_type: str) -> Layout | None:
    """The registered layout of a fully supported model type (None for others)."""
    return REGISTRY.layouts.get(model_type)


# The spec ``prepare(batch)`` assumes without a model: a family's published values, which its group declares and
# ``syncfree.families`` registers here (``REGISTRY.assumed``; the forward checks them against the model).
def register_assumed_spec(spec: ModelSpec) -> None:
    assumed = REGISTRY.assumed
    if assumed and assumed[0] != spec:
        raise ValueError(f"syncfree: two specs to assume without a model: {assumed[0].model_type!r} and "
                         f"{spec.model_type!r}; one family group declares it")
    assumed[:] = [spec]


def assumed_spec() -> ModelSpec | None:
    """The spec ``prepare(batch)`` assumes without a model (None while no family has declared one)."""
    return REGISTRY.assumed[0] if REGISTRY.assumed else None


_PLAIN = (int, str, float, bool, type(None))


def _key(value) -> str:
    """A string equal for equal specs, in every process: the compared fields' values, a nested dataclass by its own
    fields, a function by its qualified name (the same function in a DataLoader worker and in the main process)."""
    if type(value) in _PLAIN:  # (most fields: their repr, without the checks below)
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, PlanHooks):  # (a family's one frozen object: its key once, not on every prepare)
            return _hooks_key(value)
        return _fields_key(value)
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_key(v) for v in value) + ")"
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    return repr(value)


def _fields_key(value) -> str:
    fields = ",".join(_key(getattr(value, f.name)) for f in dataclasses.fields(value) if f.compare)
    return f"{type(value).__qualname__}({fields})"


_HOOK_KEYS: dict[int, tuple] = {}


def _hooks_key(hooks: PlanHooks) -> str:
    # (by identity, the object kept beside its key so that its id is not reused: families declare a handful)
    kept = _HOOK_KEYS.get(id(hooks))
    if kept is None or kept[0] is not hooks:
        kept = _HOOK_KEYS[id(hooks)] = (hooks, _fields_key(hooks))
    return kept[1]


@dataclass(frozen=True)
class ModelSpec:
    """The config values a plan depends on (checked against the model at forward time)."""

    model_type: str
    spatial_merge_size: int
    num_grid_per_side: int | None  # learned position table side (Layout.table); None: no interpolation
    image_token_id: int
    video_token_id: int
    vision_module: str  # where the stock vision helpers live (a transformers modeling module)
    window_size: int | None = None  # window attention (Layout.windows)
    patch_size: int = 16
    split_video_frames: bool = True  # one placeholder run per frame (Layout.frames_as_runs); False: one per video
    tokens_per_second: float | None = None  # video time scaling (Layout.video_time_scale)
    truncate_seconds: bool = False  # Transformers <= 5.17 truncated second_per_grid_ts to int before scaling
    # An audio encoder (Layout.audio): audio placeholders, the encoder's windows, and the stock rope index run on the
    # host.
    audio_token_id: int | None = None
    audio_window: tuple[int, int] | None = None  # (n_window, n_window_infer) of the audio encoder
    rope_class: str | None = None  # the class whose stock get_rope_index the plan runs on the host
    rope_key: tuple = ()  # the config values that index reads
    mrope: bool = True  # the family has a 3D rotary index (Layout.mrope)
    video_frames_as_images: bool = False  # (Layout.video_frames_as_images)
    tower_merge: int | None = None  # (Layout.tower_merge: the merge the tower's own helpers take)
    align_corners: bool = True  # (PositionTable.align_corners_from: how stock resamples the table)
    video_temporal_merge: int = 1  # (Layout.video_temporal_merge: frames per video token; 1 elsewhere)
    item_merge_sizes: bool = False  # (Layout.item_merge_sizes: spatial_merge_size is then 1, the merges come per item)
    host_rope_class: str | None = None  # (Layout.host_rope_class; its config values in rope_key)
    row_extra_tokens: int = 0  # (Layout.row_extra_tokens)
    item_extra_tokens: int = 0  # (Layout.item_extra_tokens)
    clip_segments: bool = False  # (Layout.clip_segments)
    segment_class_token: bool = False  # (Layout.segment_class_token)
    temporal_position_ids: bool = False  # (Layout.temporal_position_ids)
    video_span_ids: tuple[int, int] | None = None  # (Layout.video_spans: the video start and end ids)
    interp_swap_hw: bool = False  # (PositionTable.swap_hw)
    interp_padding: str = "border"  # (PositionTable.padding)
    pixel_shuffle: int = 0  # the tower's pixel-shuffle factor after its encoder (Layout.pixel_shuffle), else 0
    temporal_pooling: tuple[int, int] | None = None  # (Layout.temporal_pooling: the merge kernel)
    interp_mode: str = "bilinear"  # (PositionTable.mode)
    hooks: PlanHooks = PlanHooks()  # (Layout.plan: what the family adds to the plan)
    values: tuple = ()  # the config values the family's hooks read, as sorted (name, value) pairs (PlanHooks.values)
    config: object = dataclasses.field(default=None, compare=False, repr=False)
    # The compared fields as one string: what a traced forward compares (under dynamic shapes Dynamo takes the int
    # fields as symbols, whose equality it cannot decide while tracing; a string is a constant).
    key: str = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # (None for a spec made while Dynamo traces, which compares by the fields: see Plan.check_model)
        object.__setattr__(self, "key", None if torch.compiler.is_compiling() else _key(self))

    @classmethod
    def from_config(cls, config) -> "ModelSpec":
        model_type = config.model_type
        layout = layout_of(model_type)
        if layout is None:
            raise ValueError(f"syncfree does not support model type {model_type!r} "
                             f"(supported: {', '.join(supported_model_types())})")
        family = dict(hooks=layout.plan, values=tuple(sorted(layout.plan.values(config).items()))
                      if layout.plan.values is not None else ())
        if getattr(config, "vision_config", None) is None:  # audio only: no vision values, no image or video tokens
            return cls(model_type, 1, None, -1, -1, layout.modeling, mrope=False, audio_token_id=config.audio_token_id,
                       **family)
        vc = config.vision_config
        module = layout.vision_modeling or layout.modeling
        audio_and_index = {"audio_token_id": config.audio_token_id} if layout.audio_tokens else {}
        if layout.audio:
            ac = config.audio_config
            audio_and_index = dict(audio_token_id=config.audio_token_id,
                                   audio_window=(ac.n_window, getattr(ac, "n_window_infer", 0)),
                                   rope_class=layout.rope_class, rope_key=rope_config_key(config), config=config)
        if layout.host_rope_class is not None:
            audio_and_index = dict(host_rope_class=layout.host_rope_class,
                                   rope_key=host_rope_key(config, layout.plan.rope_config), config=config)
        return cls(
            model_type, _spatial_merge(config, layout), _table_side(vc, layout),
            config.image_token_id, getattr(config, "video_token_id", -1), module,  # (-1: an image-only family)
            window_size=_window_size(vc, layout), patch_size=vc.patch_size,
            split_video_frames=layout.frames_as_runs,
            tokens_per_second=vc.tokens_per_second if layout.video_time_scale else None,
            truncate_seconds=layout.video_time_scale and _truncates_seconds(module), mrope=layout.mrope,
            video_frames_as_images=layout.video_frames_as_images, tower_merge=layout.tower_merge,
            align_corners=_align_corners(module, layout),
            video_temporal_merge=vc.temporal_merge_size if layout.video_temporal_merge else 1,
            item_merge_sizes=layout.item_merge_sizes, row_extra_tokens=layout.row_extra_tokens,
            item_extra_tokens=layout.item_extra_tokens, clip_segments=layout.clip_segments,
            segment_class_token=layout.segment_class_token,
            temporal_position_ids=layout.temporal_position_ids,
            video_span_ids=(config.video_start_token_id, config.video_end_token_id) if layout.video_spans else None,
            temporal_pooling=_pool_kernel(vc, layout), interp_mode=_table(layout).mode,
            **_tower_options(vc, layout), **audio_and_index, **family,
        )

    def value(self, name: str):
        """A config value the family's hooks declared (``PlanHooks.values``)."""
        return dict(self.values)[name]

    def rope_options(self, second_per_grid_ts=None) -> dict:
        """The keyword arguments of ``rope_index`` for this model family."""
        options = {"spatial_merge_size": self.spatial_merge_size, "split_video_frames": self.split_video_frames}
        if self.video_temporal_merge != 1:
            options["video_temporal_merge"] = self.video_temporal_merge
        if self.tokens_per_second is not None:
            options.update(tokens_per_second=self.tokens_per_second, second_per_grid_ts=second_per_grid_ts,
                           truncate_seconds=self.truncate_seconds)
        return options

    @classmethod
    def for_vision_model(cls, visual) -> "ModelSpec":
        """The vision-side values, from a vision tower alone (token ids unknown: -1)."""
        vc = visual.config
        module = type(visual).__module__
        model_type = module.rsplit(".", 1)[-1].removeprefix("modeling_")
        layout = layout_of(model_type)
        # (A tower that merges after its encoder keeps its table on a nested module: its layout says.)
        nested = layout is not None and layout.tower_merge is not None
        # (A table the layout sizes, not the tower: on a nested module, or in the embeddings.)
        own_table = layout is not None and layout.table is not None and (
            nested or layout.table.side != "num_position_embeddings")
        per_item = layout is not None and layout.item_merge_sizes  # (its config names no merge size)
        if layout is not None and layout.pixel_shuffle:  # (the layout names the config values, as above)
            return cls(model_type, getattr(vc, layout.merge_attr), _table_side(vc, layout), -1, -1, module,
                       window_size=_window_size(vc, layout), patch_size=vc.patch_size, tower_merge=layout.tower_merge,
                       align_corners=_align_corners(module, layout), **_tower_options(vc, layout))
        return cls(
            model_type, 1 if per_item else _merge_size(vc, layout),
            _table_side(vc, layout) if own_table else getattr(visual, "num_grid_per_side", None), -1, -1, module,
            window_size=getattr(visual, "window_size", None), patch_size=vc.patch_size,
            tower_merge=layout.tower_merge if nested else None,
            align_corners=_align_corners(module, layout) if own_table else True, item_merge_sizes=per_item,
            clip_segments=layout is not None and layout.clip_segments,
            segment_class_token=layout is not None and layout.segment_class_token,
            temporal_position_ids=layout is not None and layout.temporal_position_ids,
            temporal_pooling=_pool_kernel(vc, layout) if layout is not None else None,
            interp_mode=_table(layout).mode,
        )


def _table(layout: Layout | None) -> PositionTable:
    """The layout's position table, or the defaults where it has none (the spec's resampling values then go unused)."""
    return layout.table if layout is not None and layout.table is not None else PositionTable()


def _window_size(vc, layout: Layout) -> int | None:
    """The tower's window side in pixels (window attention), else None."""
    if not layout.windows:
        return None
    return _table_side(vc, layout) * vc.patch_size if layout.window_from_table else vc.window_size


def _tower_options(vc, layout: Layout) -> dict:
    """The ModelSpec values of a tower that reads its table at (w, h) or pixel-shuffles; none elsewhere."""
    table = _table(layout)
    if not (table.swap_hw or layout.pixel_shuffle or table.padding != "border"):
        return {}
    return dict(interp_swap_hw=table.swap_hw, interp_padding=table.padding,
                pixel_shuffle=getattr(vc, layout.merge_attr) if layout.pixel_shuffle else 0)


def _spatial_merge(config, layout: Layout) -> int:
    """The merge on a side the plan's split sizes divide by (per item: 1; the family's own where its hooks say)."""
    if layout.item_merge_sizes:
        return 1
    if layout.plan.merge is not None:  # (the family's own: no merge size in its vision config)
        return layout.plan.merge(config)
    if layout.temporal_pooling:  # (its merge_kernel_size)
        return _merge_size(config.vision_config, layout)
    return getattr(config.vision_config, layout.merge_attr)


def _pool_kernel(vc, layout: Layout) -> tuple[int, int] | None:
    """The merge kernel (h, w), where the tower pools frames after its encoder (``Layout.temporal_pooling``)."""
    return tuple(vc.merge_kernel_size) if layout.temporal_pooling else None


def vision_merge_size(vc) -> int:
    """A vision config's spatial merge (image sides are multiples of patch x this): ``spatial_merge_size``, or the
    first side of a ``merge_kernel_size`` where the config names no other."""
    merge = getattr(vc, "spatial_merge_size", None)
    return merge if merge is not None else vc.merge_kernel_size[0]


def _merge_size(vc, layout: Layout | None) -> int:
    """The tokens' spatial merge: ``spatial_merge_size``, or a square ``merge_kernel_size``."""
    if layout is None or not layout.temporal_pooling:
        return vc.spatial_merge_size
    kh, kw = vc.merge_kernel_size
    if kh != kw:
        raise ValueError(f"syncfree plans square merge kernels only, got merge_kernel_size={(kh, kw)}")
    return kh


def _align_corners(module_name: str, layout: Layout) -> bool:
    """How the tower resamples its learned table: read from the installed class where the layout names one."""
    if layout.table is None or layout.table.align_corners_from is None:
        return True
    return _align_corners_in(module_name, layout.table.align_corners_from)


# What the installed source says, by question: read once per process. (Both readers below read source code: constants
# of the installed release, which a graph traced by Dynamo takes as such, without tracing ``inspect``.)
_SOURCE_FACTS: dict[tuple, bool] = {}


def _source_fact(reader):
    @functools.wraps(reader)
    def cached(*key) -> bool:
        found = _SOURCE_FACTS.get((reader.__name__, *key))
        if found is None:
            found = _SOURCE_FACTS[(reader.__name__, *key)] = reader(*key)
        return found

    return torch.compiler.assume_constant_result(cached)


@_source_fact
def _align_corners_in(module_name: str, cls_name: str) -> bool:
    import inspect
    import re

    source = inspect.getsource(getattr(importlib.import_module(module_name), cls_name).__init__)
    found = re.findall(r"self\.interpolation_align_corners\s*=\s*(True|False)\b", source)
    if len(found) != 1:
        raise ValueError(f"syncfree cannot tell how {cls_name} in the installed Transformers resamples its position "
                         "table (no single `self.interpolation_align_corners = True/False`); please report the version")
    return found[0] == "True"


def _table_side(vc, layout: Layout) -> int | None:
    """The side of the tower's learned position table, where the plan resamples it (else None)."""
    if layout.table is None:
        return None
    if layout.table.side == "num_position_embeddings":
        return int(vc.num_position_embeddings**0.5)
    if layout.table.side == "image_size":
        return vc.image_size // vc.patch_size
    return getattr(vc, layout.table.side)


@_source_fact
def _truncates_seconds(module_name: str) -> bool:
    # Older Transformers computed the video time step (Layout.video_time_scale) as tokens_per_second * int(seconds).
    import inspect

    module = importlib.import_module(module_name)
    # (The module's class that defines the rotary index: the family's, or a copy's under another name.)
    holders = [v.__dict__["get_rope_index"] for v in vars(module).values()
               if isinstance(v, type) and v.__module__ == module_name and "get_rope_index" in v.__dict__]
    return any("int(next(second_per_grid_ts))" in inspect.getsource(fn) for fn in holders)
