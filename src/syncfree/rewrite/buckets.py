"""The bucket runtime of ``syncfree.compile_vision`` (which compiles the graphs; this runs them): one static
graph per token bucket, the patched vision tower compiled once per patch-count bucket.

``compile_vision(model)`` makes every vision tower call of ``model`` pad its patches up to the next
bucket and run a ``torch.compile(fullgraph=True)`` graph made for that bucket, so any layout of
images and frames with the same bucket runs the same shapes (CUDA graphs, ``mode="reduce-overhead"``,
on a GPU). What makes a graph independent of the layout:

* the padding is one extra segment (a grid row of ``merge x pad / merge`` patches) that attends only
  to itself, so the real patches' outputs are those of the unpadded forward;
* every tensor the tower is handed has a shape fixed by the bucket: ``cu_seqlens`` (and a windowed tower's
  ``cu_window_seqlens``) are padded to their most possible segments by repeating their last value
  (empty segments), the rotary, interpolation and window tensors have a row per padded patch;
* the attention runs over the whole packed sequence (``block_diagonal``, or ``varlen`` on a GPU that
  has it), so no Python int depends on the segment sizes, and ``max_seqlen`` is the bucket.

The plan for the padded layout is made on the host (as for any patched forward): no sync. Outputs
are sliced back to the real patches. Calls with options the graph was not made for (e.g.
``output_attentions``) run the patched tower eagerly.
"""

from __future__ import annotations

import dataclasses

import torch

from ..plan.spec import ModelSpec
from ..plan.vision import VisionPlan, vision_plan
from .attention import AttentionChoice

__all__ = ["run_bucketed", "default_buckets", "padded_plan", "BucketError"]


class BucketError(ValueError):
    """An input larger than the largest bucket, or buckets that cannot hold a padding segment."""


def default_buckets(visual) -> tuple[int, ...]:
    """Patch counts 1024 .. 16384, doubling: a 448 px image is 784 patches of 16 px, 16384 patches is a
    processor's usual default pixel budget in 16 px patches (a 2048 x 2048 image)."""
    unit = visual.config.spatial_merge_size ** 2
    return tuple(b - b % unit for b in (1024, 2048, 4096, 8192, 16384))


def _pad_cumulative(cu: torch.Tensor, entries: int) -> torch.Tensor:
    """``cu`` with its last value repeated up to ``entries`` values: the extra segments are empty."""
    if cu.shape[0] > entries:
        raise BucketError(f"{cu.shape[0] - 1} segments do not fit the bucket's {entries - 1}")
    return torch.cat([cu, cu[-1:].expand(entries - cu.shape[0])])


def padded_plan(grid_thw: torch.Tensor, spec: ModelSpec, bucket: int) -> tuple[VisionPlan, int, VisionPlan]:
    """The plan for ``grid_thw`` plus a padding segment up to ``bucket`` patches, with bucket-fixed shapes;
    the number of real patches; and the padded plan as it is (unfixed cu_seqlens: for per-segment backends)."""
    merge = spec.spatial_merge_size
    real = int(grid_thw.prod(-1).sum())
    pad = bucket - real
    if pad < 0:
        raise BucketError(f"{real} patches do not fit the largest bucket, {bucket}: give compile_vision() larger "
                          "buckets (buckets=...)")
    if pad % (merge * merge):
        raise BucketError(f"bucket {bucket} is not a multiple of spatial_merge_size**2 = {merge * merge}")
    grid = grid_thw.to("cpu", torch.long)
    if pad:
        grid = torch.cat([grid, torch.tensor([[1, merge, pad // merge]])])
    plan = vision_plan(grid, spec)
    most = bucket // (merge * merge)  # every segment and window holds at least one merged patch
    fixed = {"cu_seqlens": _pad_cumulative(plan.cu_seqlens, most + 1), "max_seqlen": bucket,
             "seqlens": (), "split_sizes": ()}
    if plan.cu_window_seqlens is not None:
        fixed.update(cu_window_seqlens=_pad_cumulative(plan.cu_window_seqlens, most + 1), max_window_seqlen=bucket,
                     window_seqlens=())
    return dataclasses.replace(plan, **fixed), real, plan


def _static_kwargs(plan: VisionPlan, backend: str, exact: VisionPlan) -> dict:
    tables = plan.tables()
    kwargs = {"cu_seqlens": plan.cu_seqlens, "max_seqlen": plan.max_seqlen, "position_ids": tables["position_ids"],
              "syncfree_attention": AttentionChoice(backend)}
    if backend in ("split", "grouped", "auto"):  # per-segment backends need the real (unpadded) cu_seqlens and sizes
        kwargs.update(cu_seqlens=exact.cu_seqlens, max_seqlen=exact.max_seqlen,
                      syncfree_seqlens=exact.seqlens_by_length())
        if exact.has_windows:
            kwargs.update(cu_window_seqlens=exact.cu_window_seqlens, max_window_seqlen=exact.max_window_seqlen)
    if "interp_indices" in tables:
        kwargs.update(interp_indices=tables["interp_indices"], interp_weights=tables["interp_weights"])
    if plan.has_windows:
        kwargs.setdefault("cu_window_seqlens", plan.cu_window_seqlens)
        kwargs.setdefault("max_window_seqlen", plan.max_window_seqlen)
        kwargs["window_index"] = tables["window_index"]
    return kwargs


def _slice(out, real: int, merged: int):
    """The tower's output for the real patches only (padding rows are last, after un-windowing)."""
    hidden = out.last_hidden_state
    # (A tower that keeps a batch dim of 1 around its packed patches: the patches are dim 1.)
    out.last_hidden_state = hidden[:, :real] if hidden.dim() == 3 and hidden.shape[0] == 1 else hidden[:real]
    if out.pooler_output is not None:  # (none from a tower whose merger sits outside it)
        out.pooler_output = out.pooler_output[:merged]
    if getattr(out, "deepstack_features", None) is not None:
        out.deepstack_features = [f[:merged] for f in out.deepstack_features]
    return out


def run_bucketed(visual, hidden_states, vp: VisionPlan, extra: dict):
    """One tower call through the bucket graphs (called by the patched vision forward)."""
    buckets = visual._syncfree_buckets
    real = vp.num_patches
    bucket = next((b for b in buckets if b >= real), None)
    if bucket is None:
        raise BucketError(f"{real} patches do not fit the largest bucket, {buckets[-1]}: give compile_vision() "
                          "larger buckets (buckets=...)")
    plan, _, exact = padded_plan(vp.grid_thw, ModelSpec.for_vision_model(visual), bucket)
    if hidden_states.device.type != "cpu":
        plan, exact = plan.to(hidden_states.device), exact.to(hidden_states.device)
    pad = bucket - real
    padded = torch.cat([hidden_states, hidden_states.new_zeros(pad, hidden_states.shape[1])]) if pad else hidden_states
    out = visual._syncfree_compiled(padded, _static_kwargs(plan, visual._syncfree_bucket_backend, exact), extra)
    return _slice(out, real, real // visual.config.spatial_merge_size ** 2)
