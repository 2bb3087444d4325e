"""What rewritten stock code calls instead of the expression that synced (the ``_syncfree`` name there).

Each helper takes the stock operands and returns what the stock expression returns. It uses host
knowledge (the active plan, or sizes the caller passes) only when it can tell that knowledge
describes exactly these operands; otherwise it evaluates the stock expression itself, so behaviour never drifts
from stock. While ``torch.compile`` traces a forward that has a plan (``wrappers.traced_entry``), the helpers whose
answer is the plan's host integers (counts, positions by ``nonzero_static``) give it there too: Dynamo takes those
integers as constants and guards on them. Those that would read a host tensor's values evaluate the stock expression.

Boolean-mask indexing (``x[mask]``, ``x[mask] = y``) needs the number of true elements on the
host. Where the plan knows it, the positions come from ``torch.nonzero_static`` (an output size
given by the caller: no sync) and the rows move with ``index_select``/``index_copy_``, which copy
the same values in the same order as the boolean indexing and whose backward passes do not
sync either (unlike ``masked_select``).
"""

from __future__ import annotations

import torch

from ..plan import active

# (called from rewritten vision attention)
from .attention import segment_attention, segment_attention_with_weights, split_segments  # noqa: F401
from .chunk_delta_rule import chunk_delta_rule  # noqa: F401  (called from a gated-DeltaNet layer's forward)
from .host_index import host_index_to  # noqa: F401
from .host_mask import host_padding_mask
from .segments import segment_lengths  # noqa: F401  (called from the generic split fix)

__all__ = ["segment_attention", "segment_attention_with_weights", "split_segments", "host_padding_mask", "all_ones",
           "segment_lengths", "placeholder_count", "placeholder_numel",
           "scatter_features", "mask_at", "true_count", "put_rows", "rows_at", "put_rows_at",
           "has_vision_tokens_after", "planned_sizes", "none_packed", "packed_sequences", "host_scalar_to", "window_tail",
           "planned_kwargs", "host_index_to", "feature_split_sizes", "grid_products", "grid_rows", "grid_list",
           "traced_vision_plan", "traced_grid_rows", "chunk_delta_rule", "conv_prefill",
           "conv_tail", "traced_stream_plan", "placeholder_carrier", "size_min"]


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def size_min(bound: int, size):
    """``min(bound, size)`` where ``size`` is a size a stream's graph keeps symbolic: in a traced forward
    ``torch.sym_min``, which Python's ``min`` would turn into a guard on which is smaller (a graph per side)."""
    return torch.sym_min(bound, size) if _compiling() else min(bound, size)


def all_ones(attention_mask: torch.Tensor):
    """``torch.all(attention_mask == 1)`` (the recurrent layers' skip check), from the host copy when there is one."""
    entry = None if _compiling() else active.current()
    host = host_padding_mask(entry, attention_mask) if entry is not None and attention_mask.device.type != "cpu" \
        else None
    if host is None:
        return torch.all(attention_mask == 1)
    return bool((host == 1).all())


def placeholder_count(input_ids, mask: torch.Tensor, kind: str):
    """``special_{kind}_mask.sum()``: a host int when the active plan was built from these input_ids."""
    entry = active.current()
    if entry is not None and entry.owns(input_ids):
        return _placeholders(entry.plan, kind)
    return mask.sum()


def placeholder_numel(inputs_embeds: torch.Tensor, mask: torch.Tensor, input_ids, kind: str):
    """``inputs_embeds[mask].numel()`` for the placeholder mask of ``kind`` expanded over the hidden width: the
    plan's host count times that width when the active plan was built from these input_ids."""
    entry = active.current()
    if entry is not None and entry.owns(input_ids) and mask.dtype == torch.bool and mask.shape == inputs_embeds.shape:
        return _placeholders(entry.plan, kind) * inputs_embeds.shape[-1]
    return inputs_embeds[mask].numel()


def traced_vision_plan(tensor, field: str = "grid_thw"):
    """In a traced forward with a plan, the vision plan (images' or videos') whose forward input ``<kind>_<field>`` is the
    very tensor ``tensor``, or that a family's helper noted the tensor as the grid of (``Entry.note``: e.g. a per-frame
    grid); else None (eager: the tower and its callers are handed the plan's host copies)."""
    entry = active.current() if _compiling() else None
    if entry is None:
        return None
    for kind, vp in (("image", entry.plan.image), ("video", entry.plan.video)):
        if vp is not None and entry.given.get(f"{kind}_{field}") is tensor:
            return vp
    known = entry.known(tensor)
    return None if known is None else known[0]


def traced_grid_rows(grid_thw) -> tuple | None:
    """The plan's rows of ``grid_thw`` in a traced forward (``_traced_vision_plan``), or None: Python ints, or where
    the plan hands each item's height and width as sizes (``VisionPlan.row_carriers``) those (frames an int)."""
    vp = traced_vision_plan(grid_thw)
    if vp is None:
        return None
    if not vp.row_carriers:
        return vp.rows
    rows = []
    for (t, _, _), (height, width) in zip(vp.rows, vp.row_carriers):
        h, w = height.shape[0], width.shape[0]
        torch._check(h >= 1)  # (a grid's sides: checked at prepare; a view by (-1, h, w) divides by them)
        torch._check(w >= 1)
        rows.append((t, h, w))
    return tuple(rows)


def feature_split_sizes(grid_thw: torch.Tensor, merge_size: int):
    """``(grid_thw.prod(-1) // merge_size**2).tolist()``: the features of each image or video, computed from the
    plan's rows of that grid in a traced forward (a value Dynamo could not take out of the tensor); stock's
    expression otherwise."""
    vp = traced_vision_plan(grid_thw)
    if vp is None or not isinstance(merge_size, int):
        return (grid_thw.prod(-1) // merge_size**2).tolist()
    pixels = _traced_pixels(vp)
    if pixels is not None and vp.features_follow_patches:
        # One piece, the whole features: the forward concatenates the pieces again, and a graph whose split follows
        # the number of images would be one graph per image count (the size: the pixels' own, kept dynamic).
        return [pixels.shape[0] // merge_size**2]
    return [t * h * w // merge_size**2 for t, h, w in vp.rows]


def _traced_pixels(vp):
    """The pixels a traced forward was given for the vision plan ``vp`` (its images' or its videos'), or None."""
    entry = active.current()
    for kind, name in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        if getattr(entry.plan, kind) is vp:
            return entry.pixels.get(name)
    return None


def grid_rows(grid_thw: torch.Tensor):
    """What ``for ... in zip(..., grid_thw)`` iterates: the grid's rows (0-d tensors when unpacked), or in a traced
    forward the plan's rows of that grid as Python ints (the same values)."""
    rows = traced_grid_rows(grid_thw)
    return grid_thw if rows is None else rows


def traced_stream_plan(grid_thw):
    """The vision plan of ``grid_thw`` in a traced forward of a stream (``Layout.stream``: its host lengths and size
    carriers made at prepare), else None: where a family runs its per-item loop as one operator over the host grid."""
    vp = traced_vision_plan(grid_thw)
    return vp if vp is not None and vp.host_seqlens is not None else None


def placeholder_carrier(vp) -> torch.Tensor:
    """In a traced forward of a stream, the size carrier of the placeholders of ``vp``'s kind (``Plan.carriers``): the
    rows an operator over that kind's items yields, as a size the graph keeps symbolic."""
    plan = active.current().plan
    return plan.carriers["n_image_tokens" if vp is plan.image else "n_video_tokens"]


def grid_list(grid_thw: torch.Tensor):
    """``grid_thw.tolist()`` (a tower that sizes work per item on the host: the patched forward hands it the host grid,
    no sync), from the plan's rows of that grid in a traced forward (a value Dynamo could not take out of the tensor);
    in a traced forward of a stream (``Layout.stream``) the plan's host grid tensor itself: the family's loop over it
    runs inside an operator (rows as ints would make a graph per layout)."""
    vp = traced_vision_plan(grid_thw)
    if vp is None:
        return grid_thw.tolist()
    return vp.grid_thw if vp.host_seqlens is not None else [list(row) for row in vp.rows]


def grid_products(grid_thw: torch.Tensor):
    """``grid_thw.prod(dim=1).tolist()`` (patches per image or video), from the plan's rows in a traced forward."""
    rows = traced_grid_rows(grid_thw)
    return grid_thw.prod(dim=1).tolist() if rows is None else [t * h * w for t, h, w in rows]


def _placeholders(plan, kind: str) -> int:
    carrier = plan.carriers.get(f"n_{kind}_tokens") if _compiling() else None
    if carrier is not None:  # (traced: the count as a size Dynamo keeps symbolic, see Plan.carriers)
        return carrier.shape[0]
    return {"image": plan.n_image_tokens, "video": plan.n_video_tokens, "audio": plan.n_audio_tokens}[kind]


def scatter_features(inputs_embeds: torch.Tensor, mask: torch.Tensor, features: torch.Tensor, input_ids,
                     kind: str) -> torch.Tensor:
    """``inputs_embeds.masked_scatter(mask, features)`` for the (B, S, H) placeholder mask of ``kind``.

    Placeholder row i takes feature row i, in row-major order, as in stock; with the plan's count the
    rows move with ``index_copy``, whose backward (``index_select``) needs no host read.
    """
    entry = active.current()
    count = None
    # The mask is get_placeholder_mask's: (B, S, 1), or (B, S, H) expanded from it in older releases.
    if (entry is not None and entry.owns(input_ids) and mask.dtype == torch.bool and mask.dim() == 3
            and mask.shape[:2] == inputs_embeds.shape[:2] and mask.shape[2] in (1, inputs_embeds.shape[2])
            and features.dim() == 2 and features.dtype == inputs_embeds.dtype
            and features.shape[1] == inputs_embeds.shape[2]):
        count = _placeholders(entry.plan, kind)
    if count is None or features.shape[0] != count:
        return inputs_embeds.masked_scatter(mask, features)
    rows = inputs_embeds.reshape(-1, inputs_embeds.shape[-1])
    return rows.index_copy(0, _positions(mask[..., 0], count), features).view(inputs_embeds.shape)


def _visual_count(entry, mask: torch.Tensor) -> int | None:
    if entry is None or entry.input_ids is None or mask.dtype != torch.bool or not entry.covers(mask):
        return None
    if _compiling() and entry.plan.carriers:  # (traced: sizes Dynamo keeps symbolic, see Plan.carriers)
        return _placeholders(entry.plan, "image") + _placeholders(entry.plan, "video")
    return entry.plan.n_visual_tokens


def _positions(mask: torch.Tensor, count: int) -> torch.Tensor:
    return torch.nonzero_static(mask.reshape(-1), size=count).reshape(-1)


def mask_at(mask: torch.Tensor, visual_pos_masks: torch.Tensor) -> torch.Tensor:
    """``mask[visual_pos_masks]`` for (B, S) boolean masks."""
    count = _visual_count(active.current(), visual_pos_masks)
    if count is None or mask.shape != visual_pos_masks.shape:
        return mask[visual_pos_masks]
    return mask.reshape(-1).index_select(0, _positions(visual_pos_masks, count))


def true_count(visual_pos_masks: torch.Tensor):
    """``visual_pos_masks.sum()``, used as a size: the plan's host count of image and video placeholders."""
    count = _visual_count(active.current(), visual_pos_masks)
    return visual_pos_masks.sum() if count is None else count


def put_rows(target: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> None:
    """``target[mask, :] = rows`` for a 1D boolean ``mask`` over ``target``'s rows."""
    entry = active.current()
    if entry is None or entry.input_ids is None or mask.dim() != 1 or mask.dtype != torch.bool:
        target[mask, :] = rows
        return
    # Inside a planned forward the joint masks come from the placeholders, whose counts were checked
    # against the features on the host: mask holds exactly rows.shape[0] true values.
    target.index_copy_(0, _positions(mask, rows.shape[0]), rows)


def rows_at(hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor, count: int) -> torch.Tensor:
    """``hidden_states[visual_pos_masks, :]`` for a (B, S) boolean mask with ``count`` true values."""
    entry = active.current()
    if _visual_count(entry, visual_pos_masks) is None:
        return hidden_states[visual_pos_masks, :]
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    return flat.index_select(0, _positions(visual_pos_masks, count))


def put_rows_at(hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor, rows: torch.Tensor) -> None:
    """``hidden_states[visual_pos_masks, :] = rows`` (in place, as stock), for a (B, S) boolean mask."""
    entry = active.current()
    if _visual_count(entry, visual_pos_masks) is None or not hidden_states.is_contiguous():
        hidden_states[visual_pos_masks, :] = rows
        return
    flat = hidden_states.view(-1, hidden_states.shape[-1])
    flat.index_copy_(0, _positions(visual_pos_masks, rows.shape[0]), rows)


def has_vision_tokens_after(mm_token_type_ids, past_length) -> bool:
    """``bool(mm_token_type_ids[:, past_length:].any())`` in generate()'s position setup, from the host copy."""
    entry = None if _compiling() else active.generating()
    host = entry.plan.host.get("mm_token_type_ids") if entry is not None else None
    if host is not None and isinstance(past_length, int) and entry.given.get("mm_token_type_ids") is mm_token_type_ids:
        return bool(host[:, past_length:].any())
    return bool(mm_token_type_ids[:, past_length:].any())


def planned_sizes(max_seqlen):
    """The window sizes a planned ``max_seqlen`` carries (``syncfree.plan.audio.SegmentedMax``), or None."""
    return getattr(max_seqlen, "seqlens", None)


def none_packed(packed_sequence_mask: torch.Tensor, position_ids: torch.Tensor):
    """``(packed_sequence_mask[:, -1] == 0).all()``: no row of the batch restarts its positions. Answered from
    the plan's host copy of the position ids the forward was given (its text rows, as the text model hands
    them to the mask code), when they have the shape of the ones asked about."""
    entry = None if _compiling() else active.current()
    host = entry.plan.host.get("position_ids") if entry is not None and position_ids.device.type != "cpu" else None
    if isinstance(host, torch.Tensor) and host.dim() == 3:
        host = host[0]  # (4, B, S) text + 3D rows, or (3, B, S): the text model's text row is the first
    if not isinstance(host, torch.Tensor) or host.dim() != 2 or tuple(host.shape) != tuple(position_ids.shape):
        return (packed_sequence_mask[:, -1] == 0).all()
    restarts = torch.diff(host, prepend=host[:, :1] - 1, dim=-1) != 1  # stock's computation, on the host
    return bool((restarts.cumsum(-1)[:, -1] == 0).all())


def packed_sequences(found, inputs_embeds: torch.Tensor, position_ids, q_length, kv_length):
    """The sequence ids Transformers' mask code applies (``packed_sequence_mask``): in the forward of a packed batch, the
    plan's (each token's sample within its row), for a mask over the whole batch (no cached tokens); else ``found``."""
    entry = active.current()
    packing = entry.plan.packing if entry is not None else None
    if packing is None or not isinstance(q_length, int) or q_length != kv_length \
            or (inputs_embeds.shape[0], q_length) != tuple(packing.batch_shape):
        return found
    if position_ids is None:
        # (Stock remaps the mask's indices by the text positions: without them it could not keep the samples apart.)
        raise ValueError("a packed batch (syncfree.packing_collator) reached the text model without its text positions: "
                         "pass the batch's 4-row position_ids as they are (text row first, each sample's restarted)")
    return packing.sequence_ids


def host_scalar_to(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor.to(device)`` for a 0-d host tensor: made on the device by a fill of its (host) value, which
    neither copies nor waits; the same value and dtype. Anything else moves as stock moves it."""
    if (isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and tensor.dim() == 0
            and torch.device(device).type != "cpu" and not _compiling()):
        return torch.full((), tensor.item(), dtype=tensor.dtype, device=device)
    return tensor.to(device)


def window_tail(states: torch.Tensor, window: int) -> torch.Tensor:
    """``states[:, :, -window + 1:, :]``, the last ``window - 1`` tokens (all of them for fewer), as stock's cache
    keeps them. In a traced forward, the same tokens by a start and a length Dynamo keeps symbolic (a max and a min
    of the text's length: no guard on which is shorter, so no second graph for texts longer than the window)."""
    keep = window - 1
    if not _compiling() or not isinstance(keep, int) or keep <= 0:
        return states[:, :, -window + 1:, :]  # (stock's own slice; ``-0:`` keeps every token, as stock's does)
    return _tail_copy(states, -2, torch.sym_max(states.shape[-2] - keep, 0))


def _tail_copy(states: torch.Tensor, dim: int, start) -> torch.Tensor:
    """``states`` from ``start`` on along ``dim``, as a copy of its own: a view's contiguity depends on the text's
    length, which Inductor guards on where the tail is copied into a cache (a graph per answer). Tails are a cache
    window or a convolution kernel long."""
    length = states.shape[dim]
    return states.index_select(dim, torch.arange(start, length, device=states.device))


def conv_prefill(states: torch.Tensor, kernel: int) -> torch.Tensor:
    """A prefill's convolution states as stock's cache hands them on: left-padded with zeros up to ``kernel`` tokens
    where the text is shorter. In a traced forward, padded by ``max(kernel - length, 0)`` (no guard on which is
    longer: one graph for texts shorter and longer than the kernel); the same values."""
    length = states.shape[-1]
    if not _compiling() or not isinstance(kernel, int):
        if length < kernel:  # (stock's own branch)
            states = torch.nn.functional.pad(states, (kernel - length, 0), value=0)
        return states
    return torch.nn.functional.pad(states, (torch.sym_max(kernel - length, 0), 0), value=0)


def conv_tail(states: torch.Tensor, kernel: int) -> torch.Tensor:
    """``states[..., -kernel:]``, the convolution states a linear-attention cache keeps. In a traced forward, the
    same values as a copy of their own (``_tail_copy``): Inductor's copy of stock's slice asks whether the slice is
    contiguous, that is, whether the prefill was at most ``kernel`` tokens (``conv_prefill`` pads it to that)."""
    if not _compiling() or not isinstance(kernel, int):
        return states[..., -kernel:]
    return _tail_copy(states, -1, states.shape[-1] - kernel)


def planned_kwargs(kwargs: dict) -> dict:
    """The keyword arguments syncfree's tower wrapper added for the vision attention (segment sizes, backend),
    out of a tower's ``kwargs``: for a tower that passes its blocks no ``**kwargs`` of its own."""
    return {k: kwargs[k] for k in ("syncfree_seqlens", "syncfree_attention") if k in kwargs}
