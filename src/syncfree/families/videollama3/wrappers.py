"""The vision tower of a family whose images and videos come with their own merge sizes (VideoLLaMA3:
``forward(pixel_values, grid_thw, merge_sizes)``, images 1, videos 2).

Stock derives the rotary ids from both tensors and loops over the items in ``pixel_unshuffle``
(``split(grid_thw.prod(dim=1).tolist())``, then ``view`` / ``reshape`` / ``interpolate`` sized by
``h // merge_size``): with device tensors that is a read per size. This wrapper hands the stock forward
the plan's host grid and host merge sizes (the same values), so that loop runs on host integers, stock's
own arithmetic unchanged, and the plan's tables (rotary ids made with each row's merge) through
``make_vision_forward``.
"""

from __future__ import annotations

import functools

import torch

from ...plan import active
from ...plan.spec import ModelSpec
from ...plan.tensors import same_host_values
from ...plan.vision import vision_plan
from ...rewrite.call_args import positional_names
from ...rewrite.helpers import traced_vision_plan
from ...rewrite.host_read import read_to_host_syncs_once
from ...rewrite.roles import TOWER, wrapper
from ...rewrite.wrappers import make_vision_forward

__all__ = ["make_vision_forward_item_merges"]


def _planned(grid_thw, merge_sizes):
    """The active plan's vision plan for this grid and these merge sizes: the plan's own host tensors (what the
    patched multimodal forward hands on), or host tensors of equal values."""
    entry = active.current()
    if entry is None:
        return None
    for vp in (entry.plan.image, entry.plan.video):
        if vp is not None and vp.merge_sizes is not None and same_host_values(grid_thw, vp.grid_thw) \
                and same_host_values(merge_sizes, vp.merge_sizes):
            return vp
    return None


def _traced_planned(grid_thw, merge_sizes):
    """``_planned`` in a traced forward: the vision plan of the very grid and merge-size tensors the planned forward
    was given (host values cannot be compared there)."""
    vp = traced_vision_plan(grid_thw)
    if vp is None or vp.merge_sizes is None or traced_vision_plan(merge_sizes, "merge_sizes") is not vp:
        return None
    return vp


@wrapper("hands the stock tower the plan's segment sizes and tables, its grid and per-item merge sizes on the "
         'host (its per-item loop reads nothing)', TOWER)
def make_vision_forward_item_merges(stock):
    inner = make_vision_forward(stock)
    names = positional_names(stock)  # (pixel_values, grid_thw, merge_sizes)

    @functools.wraps(stock)
    def forward(self, *args, **kwargs):
        given = dict(zip(names, args))
        given.update(kwargs)
        if any(n not in given for n in names[:3]):
            return stock(self, *args, **kwargs)  # (stock's own error for the missing argument)
        rest = {k: v for k, v in kwargs.items() if k not in names[:3]}
        vp = rest.pop("syncfree_vision_plan", None)
        grid_thw, merge_sizes = given[names[1]], given[names[2]]
        if vp is None and torch.compiler.is_compiling():
            vp = _traced_planned(grid_thw, merge_sizes)
            if vp is None:
                return stock(self, *args, **kwargs)
            # (the call's own tensors: the rewritten stock code finds the plan's integers for them by identity)
            return inner(self, given[names[0]], grid_thw=grid_thw, merge_sizes=merge_sizes, syncfree_vision_plan=vp,
                         **rest)
        if vp is None and isinstance(grid_thw, torch.Tensor) and isinstance(merge_sizes, torch.Tensor):
            vp = _planned(grid_thw, merge_sizes)
            if vp is None:  # a tower called on its own: one read of both (none if already on the host)
                host = read_to_host_syncs_once({"grid_thw": grid_thw, "merge_sizes": merge_sizes})
                vp = vision_plan(host["grid_thw"], ModelSpec.for_vision_model(self),
                                 merge_sizes=host["merge_sizes"])
        if vp is None or vp.merge_sizes is None:
            return stock(self, *args, **kwargs)
        return inner(self, given[names[0]], grid_thw=vp.grid_thw, merge_sizes=vp.merge_sizes,
                     syncfree_vision_plan=vp, **rest)

    forward.syncfree_buckets_ok = False  # (compile_vision's buckets know one merge size: not for this tower)
    return forward
