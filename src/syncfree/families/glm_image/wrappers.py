"""``make_decode_cache_rope_index``: a family's own rotary index that also leaves the decode steps' positions on the
model (GLM-Image: ``self._cached_decode_position_ids``, ``(B, 3, steps)``, which ``compute_3d_position_ids`` slices at
every decode step, and ``self._prefill_len``).

From the plan (stock's index run on the host copies, ``glm_image.plan``): its positions and deltas, and the same two
attributes set as stock sets them, the decode positions a device tensor moved with the plan. Without a plan: one read of
the index's inputs, stock's index on the host (the same numbers), its results and decode positions sent back. A batch
only stock's own index answers as stock does (``plan.stock_rope``): stock, on the device.
"""

from __future__ import annotations

import functools

import torch

from ...plan import active
from ...plan.tensors import move
from ...rewrite.call_args import given_args, positional_names
from ...rewrite.host_read import read_to_host_syncs_once
from ...rewrite.roles import wrapper
from ...rewrite.wrappers import _prepared_plan

__all__ = ["make_decode_cache_rope_index"]


def _to(t, device):
    return move(t, device) if isinstance(t, torch.Tensor) else t


@wrapper("the plan's positions and the decode steps' positions it leaves on the model (the family's own stock "
         'index, run on the host copies)')
def make_decode_cache_rope_index(stock):
    names = positional_names(stock)

    @functools.wraps(stock)
    def get_rope_index(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return stock(self, *args, **kwargs)
        given = given_args(names, args, kwargs)
        input_ids, mask = given.get("input_ids"), given.get("attention_mask")
        entry = active.current()
        # (The forward's ids after its VQ codes were written in, where those keep the plan's positions: Entry.rope_ids.)
        mine = entry is not None and input_ids is not None and (entry.owns(input_ids) or input_ids is entry.rope_ids)
        if mine and entry.plan.stock_rope:
            return stock(self, *args, **kwargs)  # inputs stock's index refuses: its own error, from the device
        plan = None
        if mine and mask is entry.attention_mask and entry.plan.position_ids is not None:
            plan = entry.plan
        elif entry is None:
            plan = _prepared_plan(given, names)  # called on a prepared batch outside a forward
        if plan is not None:
            self._cached_decode_position_ids, self._prefill_len = plan.decode_position_ids, plan.prefill_len
            return plan.position_ids, plan.rope_deltas
        device = input_ids.device if isinstance(input_ids, torch.Tensor) else None
        positions, deltas = stock(self, **read_to_host_syncs_once({n: given[n] for n in names if n in given}))
        if device is None or device.type == "cpu":
            return positions, deltas
        self._cached_decode_position_ids = _to(self._cached_decode_position_ids, device)
        return _to(positions, device), _to(deltas, device)

    return get_rope_index
