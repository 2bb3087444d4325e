"""Which dimensions of a prepared batch and its plan follow the layout, told to Dynamo before it traces.

A stream of batches differs in its number of images, their sizes, the text lengths and the padding: those sizes are
dimensions of the tensors a traced forward is handed (the batch's and the plan's), never values it reads. Left to
itself, Dynamo first compiles every dimension static, then makes the ones that changed dynamic, one recompile per
newly changing dimension; it gives dimensions that happen to be equal one symbol ("duck sizing"), so a grid of 3
images and its 3 columns share one, which the next batch of 4 images breaks; and it compiles sizes 0 and 1 apart
(one image). Marking them here avoids all three:

- token dimensions (``input_ids``' batch and length, wherever a tensor ends with them) and the pixels' patch
  dimension (the first, or the last of a NaViT strip): dynamic from the first compile (``maybe_mark_dynamic``, a
  hint Dynamo may still overrule);
- per-item and per-segment dimensions (grid rows, the plan's per-item tables, segment lengths) and the counts a
  traced forward reads (placeholders, longest segment: ``size_carriers``): unbacked (``mark_unbacked``), with one
  symbol per quantity (``shape_id``), so no coincidence of values and no 0 or 1 makes another graph;
- every other dimension (columns, channels, rotary axes, table rows): static (``mark_static``).

A family whose traced forward loops over the items in Python (``PlanHooks.item_sizes``) is also handed each item's
height and width as sizes (``VisionPlan.row_carriers``), unbacked, one symbol each: a graph per item count.

The unbacked marks and the carriers only for a family whose traced forward was shown to take them
(``Layout.stream``): code that branches on a per-item size cannot be traced with an unbacked one. Elsewhere, and on a
PyTorch whose ``mark_unbacked`` has no ``shape_id``, the per-item dimensions are marked dynamic (Dynamo may still
specialize them: a graph per count). These are attributes of the tensor objects that only Dynamo reads: an eager
forward does not see them.
"""

from __future__ import annotations

import functools
import inspect

import torch

__all__ = ["mark_layout_dims", "size_carriers"]

# The plan's counts a traced forward reads, by name: carried as the first size of an empty host tensor.
_PLAN_COUNTS = ("n_image_tokens", "n_video_tokens", "n_audio_tokens")
_VISION_COUNTS = ("max_seqlen", "max_window_seqlen")


@functools.cache
def _markers():
    """Dynamo's markers (imported on first use: importing syncfree loads no Dynamo), and whether ``mark_unbacked``
    takes a ``shape_id``."""
    from torch._dynamo.decorators import mark_static, mark_unbacked, maybe_mark_dynamic

    return mark_static, mark_unbacked, maybe_mark_dynamic, "shape_id" in inspect.signature(mark_unbacked).parameters


def _mark(t: torch.Tensor, dynamic: tuple[int, ...] = (), per_item: dict | None = None, unbacked: bool = True) -> None:
    """``dynamic``: dims marked dynamic; ``per_item``: dim -> shape id of dims marked unbacked (dynamic where not
    ``unbacked``); the rest static."""
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return  # (Dynamo marks no tensor subclass: the emulated device's, say)
    mark_static, mark_unbacked, maybe_mark_dynamic, shape_ids = _markers()
    per_item = per_item or {}
    for d in range(t.dim()):
        if d in per_item:
            if shape_ids and unbacked:
                mark_unbacked(t, d, shape_id=per_item[d])
            else:
                maybe_mark_dynamic(t, d)
        elif d in dynamic:
            maybe_mark_dynamic(t, d)
        else:
            mark_static(t, d)


def _by_role(name: str, t: torch.Tensor, tokens: tuple[int, ...] | None, unbacked: bool, strip: bool = False) -> None:
    if t.dim() == 0:
        return
    if tokens is not None and t.dim() >= 2 and tuple(t.shape[-2:]) == tokens:
        _mark(t, dynamic=(t.dim() - 2, t.dim() - 1))
    elif strip and t.dtype.is_floating_point and t.dim() == 4:
        # (NaViT pixels: every crop side by side in one (1, channels, patch, patches * patch) strip, its patches the
        # last dimension; its first is always 1)
        _mark(t, dynamic=(3,))
    elif t.dtype.is_floating_point and t.dim() >= 2:  # pixels, features: (patches, channels...)
        _mark(t, dynamic=(0,))
    else:  # grids and other per-item inputs: (items, columns), (items,)
        _mark(t, per_item={0: _per_item_id(name)}, unbacked=unbacked)


def _per_item_id(name: str) -> str:
    """The shape id of a per-item input's rows: its own, but a grid row's merge sizes (``image_merge_sizes``) share
    their grid's (one row each; the vision plan keeps them as its grid's, ``VisionPlan.merge_sizes``)."""
    if name.endswith("_merge_sizes"):
        return f"syncfree.{name[:-len('_merge_sizes')]}_grid_thw"
    return f"syncfree.{name}"


def size_carriers(counts: dict) -> dict:
    """An empty host tensor of shape (n, 0) for each count n: a size, not a value, for Dynamo."""
    return {name: torch.empty((n, 0)) for name, n in counts.items() if isinstance(n, int)}


def mark_layout_dims(inputs: dict, plan) -> None:
    """Mark the dimensions of the prepared ``inputs`` and of ``plan``'s tensors (see the module's rules); for a family
    whose layout says one graph serves a stream (``Layout.stream``), per-item dimensions unbacked and the plan's
    counts as size carriers, elsewhere per-item dimensions dynamic."""
    from .spec import layout_of

    layout = layout_of(plan.spec.model_type)
    stream = layout is not None and layout.stream
    # (A family whose grids come as its own inputs hands its pixels as one NaViT strip, as plan.validate reads them.)
    strip = bool(plan.spec.hooks.grid_inputs)
    ids = inputs.get("input_ids")
    tokens = tuple(ids.shape) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else tuple(plan.batch_shape)
    # (an audio plan that names its own layout dimensions, and its inputs': the clips' frames, its chunks and windows,
    # its output frames; marked by it alone)
    audio = getattr(plan, "audio", None)
    audio_dims = audio.layout_dims(inputs, plan.host, plan.spec) if stream and hasattr(audio, "layout_dims") else []
    own = {id(tensor) for tensor, _ in audio_dims}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and id(value) not in own:
            _by_role(name, value, tokens, stream, strip)
    for name, value in plan.host.items():
        if isinstance(value, torch.Tensor) and id(value) not in own:
            _by_role(name, value, tokens, stream)
    for name, value in plan.family_counts.items():  # (a family's own host tables: a (rows, tokens) one the batch's)
        if isinstance(value, torch.Tensor):
            _by_role(name, value, tokens, stream)
    for tensor, dims in audio_dims:
        _mark(tensor, dynamic=dims.get("dynamic", ()), per_item=dims.get("per_item"))
    for name in ("position_ids", "rope_deltas"):
        value = getattr(plan, name, None)
        if isinstance(value, torch.Tensor):
            _by_role(name, value, tokens, stream)
    plan.shape_carrier = torch.empty((*plan.batch_shape, 0))
    _mark(plan.shape_carrier, dynamic=(0, 1))
    if isinstance(plan.checksums, torch.Tensor):
        _mark(plan.checksums)  # (one per control input, then the seed and key: fixed for a set of inputs)
    if stream:
        plan.carriers = size_carriers({**{n: getattr(plan, n, None) for n in _PLAN_COUNTS},
                                       **{n: plan.family_counts.get(n) for n in plan.spec.hooks.sizes}})
    for name, carrier in plan.carriers.items():
        _mark(carrier, per_item={0: f"syncfree.{name}"})
    for kind in ("image", "video", "video_frames"):
        vp = getattr(plan, kind, None)
        if vp is None:
            continue
        if stream:  # (the segment lengths the traced attention's operator reads on the host)
            vp.host_seqlens = torch.tensor([s + vp.segment_prefix for s in vp.seqlens], dtype=torch.int64)
            vp.host_window_seqlens = torch.tensor(vp.window_seqlens, dtype=torch.int64) if vp.window_seqlens else None
        items = {0: f"syncfree.{kind}_grid_thw"}  # (the grid's rows: the input's own shape id, see _by_role)
        if kind == "image" and plan.spec.hooks.tower_grid is not None:
            items = {0: "syncfree.image.tower_grid"}  # (the tower sees some of the input's rows: its own shape id)
        for name in ("grid_thw", "device_grid", "merge_sizes"):
            value = getattr(vp, name, None)
            if isinstance(value, torch.Tensor):
                _mark(value, per_item=items, unbacked=stream)
        if isinstance(vp.items, torch.Tensor):  # (one row per quantity, one column per item)
            _mark(vp.items, per_item={1: items[0]}, unbacked=stream)
        for name, each in (("cu_seqlens", "segments+1"), ("host_seqlens", "segments"), ("windows", "windows"),
                           ("cu_window_seqlens", "windows+1"), ("host_window_seqlens", "windows")):
            value = getattr(vp, name, None)
            if isinstance(value, torch.Tensor):
                _mark(value, per_item={value.dim() - 1: f"syncfree.{kind}.{each}"}, unbacked=stream)
        if not stream:
            continue
        vp.carriers = size_carriers({n: getattr(vp, n, None) or None for n in _VISION_COUNTS})
        for name, carrier in vp.carriers.items():
            _mark(carrier, per_item={0: f"syncfree.{kind}.{name}"})
        if plan.spec.hooks.item_sizes:  # (each item's height and width, for a forward that loops over the items)
            vp.row_carriers = tuple(tuple(torch.empty((size, 0)) for size in row[1:]) for row in vp.rows)
            for i, pair in enumerate(vp.row_carriers):
                for axis, carrier in zip(("height", "width"), pair):
                    _mark(carrier, per_item={0: f"syncfree.{kind}.item{i}.{axis}"})
        if vp.tower_tables.temporal_pooling is not None and kind in ("image", "video"):
            # (a pooling tower's merged tokens: its features, as many as the kind's placeholders, one symbol for both)
            vp.carriers.update(size_carriers({"merged_tokens": sum(vp.split_sizes)}))
            _mark(vp.carriers["merged_tokens"], per_item={0: f"syncfree.n_{kind}_tokens"})
