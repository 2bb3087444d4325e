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
from ...rewrite.roles import wrapper
from ...rewrite.wrappers import prepared_plan, rope_index_wrapper, stock_index_on_host
from .codes_op import codes_in_one_op, image_codes

__all__ = ["make_decode_cache_rope_index", "make_traced_source_grids", "make_traced_image_tokens"]


@wrapper("the plan's positions and the decode steps' positions it leaves on the model (the family's own stock "
         'index, run on the host copies)')
def make_decode_cache_rope_index(stock):
    names = positional_names(stock)

    def answer(self, given, call_stock):
        input_ids, mask = given.get("input_ids"), given.get("attention_mask")
        entry = active.current()
        # (The forward's ids after its VQ codes were written in, where those keep the plan's positions: Entry.rope_ids.)
        mine = entry is not None and input_ids is not None and (entry.owns(input_ids) or input_ids is entry.rope_ids)
        if mine and entry.plan.stock_rope:
            return call_stock()  # inputs stock's index refuses: its own error, from the device
        plan = None
        if mine and mask is entry.attention_mask and entry.plan.position_ids is not None:
            plan = entry.plan  # (in a traced forward too: its positions graph inputs, where the index would be a loop)
        elif torch.compiler.is_compiling():
            return call_stock()
        elif entry is None:
            plan = prepared_plan(given, names)  # called on a prepared batch outside a forward
        if plan is not None:
            # (stock's prefill length is the ids' padded length: in a traced forward that size itself, which a
            # stream's graph keeps symbolic, rather than the plan's int, which it would compile a graph per length for)
            traced = torch.compiler.is_compiling() and input_ids is not None  # (not plan.prefill_len: a guard on it)
            self._cached_decode_position_ids = plan.decode_position_ids
            self._prefill_len = input_ids.shape[-1] if traced else plan.prefill_len
            return plan.position_ids, plan.rope_deltas
        found = stock_index_on_host(stock, self, {n: given[n] for n in names if n in given})
        if isinstance(input_ids, torch.Tensor) and isinstance(self._cached_decode_position_ids, torch.Tensor):
            self._cached_decode_position_ids = move(self._cached_decode_position_ids, input_ids.device)
        return found

    return rope_index_wrapper(stock, answer)


@wrapper("in a traced forward, the plan's grids of the source images, made known as the tower's grid")
def make_traced_source_grids(stock):
    """``get_image_grids_for_generation(images_per_sample, image_grid_thw)``, which splits the grids by
    ``images_per_sample.tolist()``: in a traced forward, given the call's own inputs, the plan's source grids (stock's
    method run on the host copies, ``plan.source_grids``) on the device, noted as its image plan's grid (``Entry.note``),
    so the tower and ``get_image_features`` find the plan's rows for it; stock's otherwise (eager: the host copies)."""
    names = positional_names(stock)

    @functools.wraps(stock)
    def get_image_grids_for_generation(self, *args, **kwargs):
        entry = active.current() if torch.compiler.is_compiling() else None
        vp = entry.plan.image if entry is not None else None
        if vp is not None:
            given = given_args(names, args, kwargs)
            if all(given.get(n) is entry.given.get(n) for n in ("images_per_sample", "image_grid_thw")):
                entry.note(vp.device_grid, vp, vp.rows)
                return vp.device_grid
        return stock(self, *args, **kwargs)

    return get_image_grids_for_generation


@wrapper("in a traced forward of a stream, the source images' VQ codes as one operator")
def make_traced_image_tokens(stock):
    """``get_image_tokens(hidden_states)``, a loop of ``self.vqmodel.encode`` over the images' features: in a traced
    forward of a stream, the same calls inside one operator (``codes_op``), which Inductor compiles for any image
    sizes; stock's loop otherwise."""
    names = positional_names(stock)

    @functools.wraps(stock)
    def get_image_tokens(self, *args, **kwargs):
        features = given_args(names, args, kwargs).get("hidden_states")
        if codes_in_one_op(self.vqmodel, features):
            return image_codes(self.vqmodel, features)
        return stock(self, *args, **kwargs)

    return get_image_tokens
