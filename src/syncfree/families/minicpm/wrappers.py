"""The vision tower of a NaViT-packed family (MiniCPM-V / MiniCPM-OCR: ``forward(pixel_values, target_sizes,
use_vit_merger)``, all crops side by side in one ``(1, C, p, patches * p)`` strip, one ``(h, w)`` row per crop).

Stock reads ``target_sizes`` three ways: the embeddings' nearest-bucket position ids (``target_sizes.tolist()``, a
loop per crop), the cumulative lengths built in the tower (``cumsum(...).to(device)``) and the attention's split
(``lengths.tolist()`` in every block). This wrapper hands the stock forward the plan's host ``target_sizes`` (the
same values), the position ids made on the device by stock's own per-crop arithmetic on host integers (no read),
the planned ``cu_seqlens`` (taken by ``NAVIT_CU_SEQLENS``) and the host segment sizes for the split.

The in-tower window merger (``use_vit_merger`` with a layer past ``insert_layer_id``: MiniCPM-V 4.6's "16x" mode)
shrinks every segment 4x and keeps their count, which the planned split sizes (keyed by segment count) cannot tell
apart: for such a call the wrapper also makes the merger's tables (``navit.MergerTables``: stock's window
order on the host sizes, the window and post-merger segments) and holds them in ``navit.MERGER`` while stock
runs.

In a traced forward of a stream (``Layout.stream``) the tower is handed the plan's host sizes noted as its crops, the
position ids by one operator and the segments as host lengths (``_stream_kwargs``); the merger's and the window
merger's wrappers then run each module in one operator over those host sizes (``merger``), which makes the window
merger's tables inside it as this wrapper makes them. Elsewhere those two wrappers call stock's own.
"""

from __future__ import annotations

import functools

import torch

from ...plan import active
from ...plan.spec import ModelSpec
from ...plan.tensors import same_host_values
from ...plan.vision import VisionPlan, vision_plan
from ...rewrite.call_args import given_args, positional_names, same_device
from ...rewrite.host_read import read_to_host_syncs_once, send_plan_back
from ...rewrite.roles import TOWER, wrapper
from ...rewrite.segments import TracedSegments
from .merger import merged_crops, merged_windows
from .navit import MERGER, merger_tables, note_stream_crops, stream_crops, traced_crops

__all__ = ["make_vision_forward_target_sizes", "make_merger_forward", "make_window_merger_forward",
           "nearest_position_ids"]


def nearest_position_ids(rows: list, num_patches_per_side: int, device) -> torch.Tensor:
    """``get_vision_nearest_position_ids`` (Transformers' ``vision_utils``) on host ``(h, w)`` rows: its very ops,
    made on ``device`` (factories sized by host ints: no read, no copy)."""
    boundaries = torch.arange(1 / num_patches_per_side, 1.0, 1 / num_patches_per_side, device=device)
    pos_ids_list = []
    for height, width in rows:
        h_coords = torch.arange(height, device=device) / height
        w_coords = torch.arange(width, device=device) / width
        bucket_h = torch.bucketize(h_coords, boundaries, right=True)
        bucket_w = torch.bucketize(w_coords, boundaries, right=True)
        pos_ids_list.append((bucket_h[:, None] * num_patches_per_side + bucket_w).flatten())
    return torch.cat(pos_ids_list)


def _planned(target_sizes) -> tuple[VisionPlan, torch.Tensor] | None:
    """The active plan's vision plan for these crop sizes, with the plan's host copy of them."""
    entry = active.current()
    if entry is None:
        return None
    for vp, name in ((entry.plan.image, "target_sizes"), (entry.plan.video, "target_sizes_videos")):
        host = entry.plan.host.get(name)
        if vp is not None and isinstance(host, torch.Tensor) and same_host_values(target_sizes, host):
            return vp, host
    return None


def _merger_runs(tower, use_vit_merger) -> bool:
    layer = tower.config.insert_layer_id if use_vit_merger else -1
    return bool(use_vit_merger) and 0 <= layer < len(tower.encoder.layers)


@wrapper("hands the stock NaViT tower its target_sizes on the host, the plan's segment sizes, cumulative "
         'lengths and position ids', TOWER)
def make_vision_forward_target_sizes(stock):
    names = positional_names(stock)  # (pixel_values, target_sizes, use_vit_merger)

    @functools.wraps(stock)
    def forward(self, *args, **kwargs):
        vp = kwargs.pop("syncfree_vision_plan", None)  # (a caller holding the plan: compile_vision, torch.compile)
        given = given_args(names, args, kwargs)
        pixels, sizes = given.get(names[0]), given.get(names[1])
        use_vit_merger = given.get(names[2], True)
        if not isinstance(pixels, torch.Tensor) or not isinstance(sizes, torch.Tensor) or sizes.dim() != 2:
            return stock(self, *args, **kwargs)
        in_traced_forward = vp is None and torch.compiler.is_compiling()
        stream = stream_crops(sizes) if in_traced_forward else None
        if stream is not None:
            # (the host sizes noted as the plan's crops: the window merger and the segments after it find them so)
            note_stream_crops(stream[1], *stream)
            return stock(self, pixels, stream[1], use_vit_merger,
                         **{**_stream_kwargs(self, stream[0], pixels), **{k: v for k, v in kwargs.items()
                                                                         if k not in names[:3]}})
        if in_traced_forward:
            # A traced forward: the plan of these very sizes, which stock then reads only through the rewritten code
            # (the plan's rows as Python ints: navit.traced_crops); none (stock's graph, breaks and all) without one.
            traced = traced_crops(sizes)
            if traced is None or traced[0] is None:
                return stock(self, *args, **kwargs)
            vp = traced[0]
        # (no crops: stock's own; counted on the plan's rows where there is one, as a traced stream forward's crop
        # count is a size Dynamo keeps unbacked, which no branch may test)
        if not (vp.rows if vp is not None else sizes.shape[0]):
            return stock(self, *args, **kwargs)
        found = (vp, sizes) if vp is not None else _planned(sizes)
        if found is None:  # a tower called on its own: one read of the sizes (none if already on the host)
            host = read_to_host_syncs_once({"target_sizes": sizes})["target_sizes"]
            spec = ModelSpec(type(self).__module__, 1, None, -1, -1, type(self).__module__,
                             patch_size=self.config.patch_size)
            found = vision_plan(torch.nn.functional.pad(host.to(torch.long), (1, 0), value=1), spec,
                                "target_sizes"), host
        vp, host = found
        rest = {k: v for k, v in kwargs.items() if k not in names[:3]}
        if not same_device(vp.device, pixels.device):
            vp = send_plan_back(vp, pixels.device)
        key = ("navit_position_ids", self.embeddings.num_patches_per_side)
        position_ids = vp.tables_made.get(key)
        if position_ids is None:
            rows = [(h, w) for _, h, w in vp.rows]
            position_ids = nearest_position_ids(rows, self.embeddings.num_patches_per_side, pixels.device)
            if not torch.compiler.is_compiling():
                vp.tables_made[key] = position_ids
        extra = {"position_ids": position_ids, "syncfree_cu_seqlens": vp.cu_seqlens,
                 "syncfree_seqlens": vp.seqlens_by_length()}
        if _flash(self.config):  # (stock reads the longest segment only for flash attention)
            extra["max_seqlen"] = vp.max_seqlen
        if not _merger_runs(self, use_vit_merger) or in_traced_forward:
            # (a traced forward: the merger's edits build its tables in the graph from the plan's rows, see
            # navit.navit_window_index; the tower traced alone with its plan keeps the tables below)
            return stock(self, pixels, host, use_vit_merger, **{**extra, **rest})
        tables = vp.tables_made.get("navit_merger")
        if tables is None:
            tables = merger_tables(self.vit_merger, host, pixels.device)
            if not torch.compiler.is_compiling():
                vp.tables_made["navit_merger"] = tables
        token = MERGER.set(tables)
        try:
            return stock(self, pixels, host, use_vit_merger, **{**extra, **rest})
        finally:
            MERGER.reset(token)

    forward.syncfree_buckets_ok = False  # (compile_vision's buckets are Qwen-VL grids: not for this tower)
    return forward


def _per_crop_in_one_op(stock, run):
    """``stock`` (a module's ``forward(hidden_states, target_sizes)``), whose per-crop work runs as ``run(module,
    hidden_states, vision plan, host sizes)`` in a traced forward of a stream; stock's own elsewhere."""
    names = positional_names(stock)  # (hidden_states, target_sizes)

    @functools.wraps(stock)
    def forward(self, *args, **kwargs):
        given = given_args(names, args, kwargs)
        stream = stream_crops(given.get(names[1])) if torch.compiler.is_compiling() else None
        if stream is None:
            return stock(self, *args, **kwargs)
        return run(self, given.get(names[0]), *stream)

    return forward


@wrapper("runs the merger's per-crop loop as one operator over the plan's host crop sizes in a traced forward of a "
         "stream")
def make_merger_forward(stock):
    return _per_crop_in_one_op(stock, lambda merger, hidden, vp, host: merged_crops(
        merger, hidden, host, "image" if vp is active.current().plan.image else "video"))


@wrapper("runs the in-tower window merger as one operator over the plan's host crop sizes in a traced forward of a "
         "stream")
def make_window_merger_forward(stock):
    return _per_crop_in_one_op(stock, lambda merger, hidden, vp, host: merged_windows(merger, hidden, host))


def _stream_kwargs(tower, vp: VisionPlan, pixels: torch.Tensor) -> dict:
    """What the tower is handed in a traced forward of a stream (``Layout.stream``), read from no row of the plan (a
    row read is a guard, a graph per layout): the position ids made by one operator on the plan's host sizes, sized by
    the pixels' patches; the planned ``cu_seqlens``; the segments as the host lengths the attention's operator takes
    (``TracedSegments``)."""
    patch = tower.config.patch_size
    extra = {"position_ids": _stream_position_ids(vp.grid_thw, tower.embeddings.num_patches_per_side, pixels,
                                                  patch),
             "syncfree_cu_seqlens": vp.cu_seqlens,
             "syncfree_seqlens": TracedSegments([(vp.cu_seqlens, vp.host_seqlens,
                                                  lambda: vp.seqlens_by_length()[len(vp.seqlens) + 1])],
                                                vp.seqlens_by_length)}
    if _flash(tower.config):
        extra["max_seqlen"] = vp.carriers["max_seqlen"].shape[0]
    return extra


@torch.library.custom_op("syncfree::navit_position_ids", mutates_args=())
def _position_ids_op(grid: torch.Tensor, num_patches_per_side: int, pixels: torch.Tensor, patch: int) -> torch.Tensor:
    # (the host grid's (1, h, w) rows; made on the pixels' device, as the eager path makes them)
    return nearest_position_ids([(h, w) for _, h, w in grid.tolist()], num_patches_per_side, pixels.device)


@_position_ids_op.register_fake
def _(grid, num_patches_per_side, pixels, patch):
    # (one id per patch of the NaViT strip (1, C, p, patches * p))
    return pixels.new_empty((pixels.shape[-1] // patch,), dtype=torch.long)


def _stream_position_ids(grid, num_patches_per_side: int, pixels, patch: int) -> torch.Tensor:
    return _position_ids_op(grid, num_patches_per_side, pixels, patch)


def _flash(config) -> bool:
    return "flash" in str(getattr(config, "_attn_implementation", "") or "")
