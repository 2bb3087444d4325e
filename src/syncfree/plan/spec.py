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
from .traits import AudioLayout, PositionTable, RotaryIndex, TowerShape, VideoLayout

__all__ = ["Layout", "PositionTable", "TowerShape", "VideoLayout", "RotaryIndex", "AudioLayout", "ModelSpec",
           "multimodal_config", "register_layout", "supported_model_types",
           "layout_of", "vision_merge_size", "register_assumed_spec", "assumed_spec"]


@dataclass(frozen=True)
class Layout:
    """How a family lays out its inputs: what the plan and the rope index need to know about it. What only some families
    do is in its traits (``plan.traits``: small frozen objects, one concept each, whose defaults are the shared plan's);
    the fields here are those several family groups set."""

    modeling: str  # the Transformers modeling module holding the family's classes and vision helpers
    table: PositionTable | None = None  # a learned position table in the vision tower, resampled to each grid
    tower: TowerShape = TowerShape()  # how the vision tower is built and what it makes of a grid row
    video: VideoLayout = VideoLayout()  # how a video's placeholders and positions are laid out
    rope: RotaryIndex = RotaryIndex()  # how positions are made (the shared 3D index, none, or stock's on the host)
    audio: AudioLayout = AudioLayout()  # an audio encoder, or audio placeholders
    # The processor's markers around each image or video (the config's ids); False where the chat template
    # writes them and the config names none.
    vision_markers: bool = True
    # The processor returns (and the forward takes) mm_token_type_ids.
    token_types: bool = True
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
# A family's frozen objects, which it declares once: keyed once each (by identity), not on every prepare.
_TRAITS = (PlanHooks, PositionTable, TowerShape, VideoLayout, RotaryIndex, AudioLayout)


def _key(value) -> str:
    """A string equal for equal specs, in every process: the compared fields' values, a nested dataclass by its own
    fields, a function by its qualified name (the same function in a DataLoader worker and in the main process)."""
    if type(value) in _PLAIN:  # (most fields: their repr, without the checks below)
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, _TRAITS):  # (a family's frozen objects: their key once, not on every prepare)
            return _trait_key(value)
        return _fields_key(value)
    if isinstance(value, (tuple, list)):
        if _plain_tree(value):  # (plain values nested in tuples, as a rotary key's pairs: one repr, not one per value)
            return repr(tuple(value))
        return "(" + ",".join(_key(v) for v in value) + ")"
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    return repr(value)


def _plain_tree(value) -> bool:
    return all(type(v) in _PLAIN or type(v) is tuple and _plain_tree(v) for v in value)


def _fields_key(value) -> str:
    cls = type(value)
    names = _COMPARED.get(cls)
    if names is None:  # (a dataclass' compared fields, once per class: ``dataclasses.fields`` builds them per call)
        names = _COMPARED[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.compare)
    fields = ",".join([repr(v) if type(v) in _PLAIN else _key(v) for v in map(value.__getattribute__, names)])
    return f"{cls.__qualname__}({fields})"


_COMPARED: dict[type, tuple[str, ...]] = {}


_TRAIT_KEYS: dict[int, tuple] = {}


def _trait_key(trait) -> str:
    # (by identity, the object kept beside its key so that its id is not reused: families declare a handful)
    kept = _TRAIT_KEYS.get(id(trait))
    if kept is None or kept[0] is not trait:
        kept = _TRAIT_KEYS[id(trait)] = (trait, _fields_key(trait))
    return kept[1]


@dataclass(frozen=True)
class ModelSpec:
    """The config values a plan depends on, and the family's traits that say how (checked against the model at forward
    time)."""

    model_type: str
    spatial_merge_size: int
    num_grid_per_side: int | None  # learned position table side (Layout.table); None: no interpolation
    image_token_id: int
    video_token_id: int
    vision_module: str  # where the stock vision helpers live (a transformers modeling module)
    window_size: int | None = None  # window attention in pixels (TowerShape.windows)
    patch_size: int = 16
    tokens_per_second: float | None = None  # video time scaling (VideoLayout.time_scale)
    truncate_seconds: bool = False  # Transformers <= 5.17 truncated second_per_grid_ts to int before scaling
    # An audio encoder (AudioLayout.encoder): audio placeholders, the encoder's windows, and the stock rope index run
    # on the host; audio placeholders alone (AudioLayout.tokens): their id.
    audio_token_id: int | None = None
    audio_window: tuple[int, int] | None = None  # (n_window, n_window_infer) of the audio encoder
    # how many chunks the encoder convolves at a time (conv_chunksize), where it groups them (AudioPlan.layout_dims)
    audio_conv_chunks: int | None = None
    rope_key: tuple = ()  # the config values a rotary index run as stock on the host reads (RotaryIndex)
    align_corners: bool = True  # how stock resamples the table (read where PositionTable.align_corners_from says)
    video_temporal_merge: int = 1  # frames per video token (VideoLayout.temporal_merge); 1 elsewhere
    video_span_ids: tuple[int, int] | None = None  # the video start and end ids (VideoLayout.spans)
    pixel_shuffle: int = 0  # the tower's pixel-shuffle factor after its encoder (TowerShape.pixel_shuffle), else 0
    temporal_pooling: tuple[int, int] | None = None  # the merge kernel (TowerShape.temporal_pooling)
    # The family's traits (its Layout's): the learned table (None: none), its tower, its videos, its positions.
    table: PositionTable | None = None
    tower: TowerShape = TowerShape()
    video: VideoLayout = VideoLayout()
    rope: RotaryIndex = RotaryIndex()
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
            # (every field of the layout's own, not a class default: a spec made while Dynamo traces, a compiled
            # model's first call, can only build objects that come from somewhere)
            return cls(model_type, 1, None, -1, -1, layout.modeling, rope=_NO_INDEX, tower=layout.tower,
                       video=layout.video, audio_token_id=config.audio_token_id, **family)
        vc = config.vision_config
        module = layout.tower.modeling or layout.modeling
        audio_and_index = {"audio_token_id": config.audio_token_id} if layout.audio.tokens else {}
        if layout.audio.encoder:
            ac = config.audio_config
            audio_and_index = dict(audio_token_id=config.audio_token_id,
                                   audio_window=(ac.n_window, getattr(ac, "n_window_infer", 0)),
                                   audio_conv_chunks=getattr(ac, "conv_chunksize", None),
                                   rope_key=rope_config_key(config), config=config)
        if layout.rope.host_class is not None:
            audio_and_index = dict(rope_key=host_rope_key(config, layout.plan.rope_config), config=config)
        video = layout.video
        return cls(
            model_type, _spatial_merge(config, layout), _table_side(vc, layout),
            config.image_token_id, getattr(config, "video_token_id", -1), module,  # (-1: an image-only family)
            window_size=_window_size(vc, layout), patch_size=vc.patch_size,
            tokens_per_second=vc.tokens_per_second if video.time_scale else None,
            truncate_seconds=video.time_scale and _truncates_seconds(module),
            align_corners=_align_corners(module, layout),
            video_temporal_merge=vc.temporal_merge_size if video.temporal_merge else 1,
            video_span_ids=(config.video_start_token_id, config.video_end_token_id) if video.spans else None,
            pixel_shuffle=_shuffle(vc, layout), temporal_pooling=_pool_kernel(vc, layout),
            table=layout.table, tower=layout.tower, video=video, rope=layout.rope, **audio_and_index, **family,
        )

    def value(self, name: str):
        """A config value the family's hooks declared (``PlanHooks.values``)."""
        return dict(self.values)[name]

    def rope_options(self, second_per_grid_ts=None) -> dict:
        """The keyword arguments of ``rope_index`` for this model family."""
        options = {"spatial_merge_size": self.spatial_merge_size, "split_video_frames": self.video.frames_as_runs}
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
        if layout is None:  # (a tower syncfree has no layout for: the shared plan's, its values read off the tower)
            return cls(model_type, vc.spatial_merge_size, getattr(visual, "num_grid_per_side", None), -1, -1, module,
                       window_size=getattr(visual, "window_size", None), patch_size=vc.patch_size)
        tower = _tower_alone(layout.tower)
        # (A table the layout sizes, not the tower: on a nested module, as where it merges after its encoder, or in
        # the embeddings.)
        own_table = layout.table is not None and (
            tower.encoder_merge is not None or layout.table.side != "num_position_embeddings")
        if tower.pixel_shuffle:  # (the layout names the config values, as above)
            return cls(model_type, getattr(vc, tower.merge_attr), _table_side(vc, layout), -1, -1, module,
                       window_size=_window_size(vc, layout), patch_size=vc.patch_size,
                       align_corners=_align_corners(module, layout), pixel_shuffle=_shuffle(vc, layout),
                       table=layout.table, tower=tower)
        return cls(
            model_type, 1 if tower.item_merge_sizes else _merge_size(vc, layout),  # (per item: its config names none)
            _table_side(vc, layout) if own_table else getattr(visual, "num_grid_per_side", None), -1, -1, module,
            window_size=getattr(visual, "window_size", None), patch_size=vc.patch_size,
            align_corners=_align_corners(module, layout) if own_table else True,
            temporal_pooling=_pool_kernel(vc, layout), table=layout.table, tower=tower,
        )


# The rotary index of a family without vision (audio only): no positions of its own to plan.
_NO_INDEX = RotaryIndex(mrope=False)
_ALONE: dict[int, tuple] = {}


def _tower_alone(tower: TowerShape) -> TowerShape:
    """The tower's shape as a plan of the tower alone sees it: without the tokens its model's merger adds around the
    merged rows and items (a tower called on its own is planned by its patches; kept by identity, as ``_trait_key``)."""
    if not (tower.row_extra_tokens or tower.item_extra_tokens):
        return tower
    kept = _ALONE.get(id(tower))
    if kept is None or kept[0] is not tower:
        kept = _ALONE[id(tower)] = (tower, dataclasses.replace(tower, row_extra_tokens=0, item_extra_tokens=0))
    return kept[1]


def _window_size(vc, layout: Layout) -> int | None:
    """The tower's window side in pixels (window attention), else None."""
    if not layout.tower.windows:
        return None
    return _table_side(vc, layout) * vc.patch_size if layout.tower.window_from_table else vc.window_size


def _shuffle(vc, layout: Layout) -> int:
    """The tower's pixel-shuffle factor after its encoder (its merge), else 0."""
    return getattr(vc, layout.tower.merge_attr) if layout.tower.pixel_shuffle else 0


def _spatial_merge(config, layout: Layout) -> int:
    """The merge on a side the plan's split sizes divide by (per item: 1; the family's own where its hooks say)."""
    if layout.tower.item_merge_sizes:
        return 1
    if layout.plan.merge is not None:  # (the family's own: no merge size in its vision config)
        return layout.plan.merge(config)
    if layout.tower.temporal_pooling:  # (its merge_kernel_size)
        return _merge_size(config.vision_config, layout)
    return getattr(config.vision_config, layout.tower.merge_attr)


def _pool_kernel(vc, layout: Layout) -> tuple[int, int] | None:
    """The merge kernel (h, w), where the tower pools frames after its encoder (``TowerShape.temporal_pooling``)."""
    return tuple(vc.merge_kernel_size) if layout.tower.temporal_pooling else None


def vision_merge_size(vc) -> int:
    """A vision config's spatial merge (image sides are multiples of patch x this): ``spatial_merge_size``, or the
    first side of a ``merge_kernel_size`` where the config names no other."""
    merge = getattr(vc, "spatial_merge_size", None)
    return merge if merge is not None else vc.merge_kernel_size[0]


def _merge_size(vc, layout: Layout) -> int:
    """The tokens' spatial merge: ``spatial_merge_size``, or a square ``merge_kernel_size``."""
    if not layout.tower.temporal_pooling:
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
    # Older Transformers computed the video time step (VideoLayout.time_scale) as tokens_per_second * int(seconds).
    import inspect

    module = importlib.import_module(module_name)
    # (The module's class that defines the rotary index: the family's, or a copy's under another name.)
    holders = [v.__dict__["get_rope_index"] for v in vars(module).values()
               if isinstance(v, type) and v.__module__ == module_name and "get_rope_index" in v.__dict__]
    return any("int(next(second_per_grid_ts))" in inspect.getsource(fn) for fn in holders)
