"""HunYuan-VL's and HY-V4-VL's tower loops in a traced forward of a stream (``Layout.stream``).

Both towers loop over their items twice, by sizes read from the grid: the patch embedding resamples its learned
position table to each item (``for t, h, w in grid_thw``: an ``F.interpolate`` to each size), and the tower splits
the blocks' output by patches per item and runs its merger on each (``self.patch_merger(item, size=(h, w))``:
convolutions sized by the item). Unrolled by Dynamo, a graph per layout. In a traced forward of a stream each loop
runs inside one operator over the plan's host grid (reading it waits for no device): stock's own methods
(``interpolate_pos_encoding``, the merger's ``forward``) called in stock's order, on a stand-in for the module that
holds the very tensors the operator was handed, so the outputs are the eager ones bit for bit. The modules'
parameters are tensor arguments of the operators (the merger's a list), so the backward, which runs the loop again
under autograd (``recomputed_op``), gives them their gradients as eager autograd does.

Why a stand-in, where MiniCPM's merger operators run the module itself on the operator's weights
(``torch.func.functional_call``): HunYuan-VL's merger holds a parameter its forward never reads (``image_sep``).
Eager autograd leaves its gradient ``None``, so an optimizer skips it; an operator taking every parameter would have
to return a gradient for it, zeros, which an optimizer does not skip (weight decay, moments). The stand-in takes the
parts the forward reads and nothing else, and fails by name on a part it does not model.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

from ...rewrite.helpers import placeholder_carrier, traced_grid_rows, traced_stream_plan
from ...rewrite.recomputed_op import class_path, recomputed_op, stock_class

__all__ = ["in_one_op", "resampled_positions", "item_patches", "merged_items", "listed_rows"]


def in_one_op(grid_thw) -> bool:
    """Whether a loop over ``grid_thw``'s items runs as one operator: in a traced forward of a stream."""
    return traced_stream_plan(grid_thw) is not None


# ---- the position table resampled to every item ------------------------------------------------------------------

def _positions(table: torch.Tensor, grid: torch.Tensor, embed: str, edge: int, mode: str,
               dtype: torch.dtype) -> torch.Tensor:
    """Stock's loop (``...VisionPatchEmbed.forward``): its ``interpolate_pos_encoding`` per grid row, on a stand-in
    holding the table (what the method reads of its module: the table, its edge and width, the mode; of the
    embeddings: their dtype)."""
    method = stock_class(embed).interpolate_pos_encoding
    module = types.SimpleNamespace(position_embedding=types.SimpleNamespace(weight=table), position_edge=edge,
                                   embed_dim=table.shape[-1], config=types.SimpleNamespace(interpolate_mode=mode))
    like = types.SimpleNamespace(dtype=dtype)
    return torch.concat([method(module, like, h, w).squeeze(0).repeat(t, 1) for t, h, w in grid.tolist()], dim=0)


# (a row per patch: the embeddings it is added to give the size, their patch count, a size Dynamo keeps dynamic)
_positions_op = recomputed_op(
    "syncfree::hunyuan_positions", _positions,
    lambda table, grid, embed, edge, mode, dtype, patches: table.new_empty((patches.shape[0], table.shape[-1]),
                                                                           dtype=dtype),
    sized_by=("patches",))


def resampled_positions(embed, embeddings: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """Stock's per-item position embeddings, concatenated (the patch embedding ``embed``'s loop over ``grid_thw``),
    as one operator over the plan's host grid."""
    return _positions_op(embed.position_embedding.weight, traced_stream_plan(grid_thw).grid_thw,
                         class_path(type(embed)), embed.position_edge, embed.config.interpolate_mode,
                         embeddings.dtype, embeddings)


# ---- the merger on every item -----------------------------------------------------------------------------------

# What the mergers' forward reads of itself, in this order, by kind (HY-V4-VL's has no ``mlp``, ``after_rms`` nor
# begin/end embeddings). A convolution, a linear layer and an RMS norm stand in as the calls their forward makes.
_PARTS = (("before_rms", "norm"), ("proj_conv", "conv"), ("proj_act", "act"), ("proj_out", "conv"),
          ("mlp", "linear"), ("image_newline", "tensor"), ("image_begin", "tensor"), ("image_end", "tensor"),
          ("after_rms", "norm"))
_KINDS = dict(_PARTS)


def _stand_in(params: list[torch.Tensor], parts: str, norm: str, eps: list[float], strides: list[int],
              act: str):
    """The merger as its forward sees it, holding ``params`` (in the order of ``parts``, its names joined by commas:
    an operator takes no list of strings): ``nn.Conv2d`` / ``nn.Linear``'s
    own call (``F.conv2d`` with the stride, no padding; ``F.linear``), stock's norm's ``forward``, the activation
    ``ACT2FN`` makes."""
    from transformers.activations import ACT2FN

    params, eps, strides = iter(params), iter(eps), iter(strides)
    module = types.SimpleNamespace()
    for name in parts.split(","):
        kind = _KINDS[name]
        if kind == "norm":
            value = functools.partial(stock_class(norm).forward,
                                      types.SimpleNamespace(weight=next(params), variance_epsilon=next(eps)))
        elif kind == "conv":
            value = functools.partial(_conv, weight=next(params), bias=next(params), stride=next(strides))
        elif kind == "linear":
            value = functools.partial(F.linear, weight=next(params), bias=next(params))
        elif kind == "act":
            value = ACT2FN[act]
        else:
            value = next(params)
        setattr(module, name, value)
    return module


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int) -> torch.Tensor:
    return F.conv2d(x, weight, bias, stride)


def _merged(hidden: torch.Tensor, params: list[torch.Tensor], grid: torch.Tensor, merger: str, parts: str,
            norm: str, eps: list[float], strides: list[int], act: str, width: int) -> torch.Tensor:
    """Stock's split and loop (the tower's ``forward``): the merger's ``forward`` on each item's patches, on a stand-in
    holding ``params``; concatenated. (``width``: of the output, for the fake only.)"""
    forward, module = stock_class(merger).forward, _stand_in(params, parts, norm, eps, strides, act)
    rows = grid.tolist()
    items = torch.split(hidden, [t * h * w for t, h, w in rows], dim=1)
    return torch.cat([forward(module, item, size=(h, w)) for (_, h, w), item in zip(rows, items)], dim=1)


# (the features: as many as the kind's placeholders, whose count the plan carries as a size)
_merged_op = recomputed_op(
    "syncfree::hunyuan_merged", _merged,
    lambda hidden, params, grid, merger, parts, norm, eps, strides, act, width, features:
        hidden.new_empty((1, features.shape[0], width)),
    differentiable=2, sized_by=("features",))


def _modelled(merger) -> list[str]:
    """The parts of ``merger`` its stand-in models (the kinds ``_PARTS`` names, the convolutions unpadded, every
    layer with its bias, the norms with their epsilon); a merger built otherwise is refused in one line (a traced
    stream forward has no other way: stock's loop would size the features by the grid's values)."""
    parts = [name for name, _ in _PARTS if hasattr(merger, name)]
    for name in parts:
        kind, part = _KINDS[name], getattr(merger, name)
        if kind == "conv" and not (type(part) is torch.nn.Conv2d and part.padding_mode == "zeros"
                                   and part.stride[0] == part.stride[1] and tuple(part.padding) == (0, 0)
                                   and tuple(part.dilation) == (1, 1) and part.groups == 1 and part.bias is not None):
            raise NotImplementedError(f"syncfree: {type(merger).__name__}.{name} is not the convolution the traced "
                                      "stream forward's merger operator models")
        if kind == "linear" and not (type(part) is torch.nn.Linear and part.bias is not None):
            raise NotImplementedError(f"syncfree: {type(merger).__name__}.{name} is not the linear layer the traced "
                                      "stream forward's merger operator models")
        if kind == "norm" and not isinstance(getattr(part, "variance_epsilon", None), float):
            raise NotImplementedError(f"syncfree: {type(merger).__name__}.{name} is not the RMS norm the traced "
                                      "stream forward's merger operator models")
    return parts


def item_patches(grid_thw: torch.Tensor, hidden_states: torch.Tensor):
    """``grid_thw.prod(dim=-1).tolist()`` (patches per item, for the split before the merger's loop), from the plan's
    rows in a traced forward; in a traced forward of a stream, where the loop runs as one operator, one piece, all
    the patches (a split per item would be a graph per item count)."""
    if in_one_op(grid_thw):
        return [hidden_states.shape[1]]
    rows = traced_grid_rows(grid_thw)
    return grid_thw.prod(dim=-1).tolist() if rows is None else [t * h * w for t, h, w in rows]


def listed_rows(grid_thw: torch.Tensor):
    """``grid_thw.tolist()`` (the host grid the patched tower is handed: no sync), the plan's rows of it in a traced
    forward (a value Dynamo could not take out of the tensor)."""
    rows = traced_grid_rows(grid_thw)
    return grid_thw.tolist() if rows is None else [list(row) for row in rows]


def _merger_arguments(merger) -> tuple:
    """What the operator takes of ``merger`` (one ``_modelled``): its class, its parts (joined by commas), their
    tensors in that order, its norm's class, the norms' epsilons and the convolutions' strides (in that order), its
    activation, its output's width (its last projection's)."""
    parts = _modelled(merger)
    params, eps, strides = [], [], []
    for name in parts:
        kind, part = _KINDS[name], getattr(merger, name)
        if kind == "norm":
            params.append(part.weight)
            eps.append(float(part.variance_epsilon))
        elif kind in ("conv", "linear"):
            params += [part.weight, part.bias]
            strides += [int(part.stride[0])] if kind == "conv" else []
        elif kind == "tensor":
            params.append(part)
    norm = next((class_path(type(getattr(merger, n))) for n in parts if _KINDS[n] == "norm"), "")
    width = merger.mlp.out_features if "mlp" in parts else merger.proj_out.out_channels
    return (params, class_path(type(merger)), ",".join(parts), norm, eps, strides, merger.config.hidden_act, width)


def merged_items(merger, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """The merger's outputs over every item of ``grid_thw``, concatenated (stock's loop), as one operator over the
    plan's host grid, sized by the count of the kind's placeholders."""
    vp = traced_stream_plan(grid_thw)
    params, *rest = _merger_arguments(merger)
    return _merged_op(hidden_states, params, vp.grid_thw, *rest, placeholder_carrier(vp))
