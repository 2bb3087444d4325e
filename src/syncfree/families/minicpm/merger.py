"""MiniCPM's per-crop modules in a traced forward of a stream (``Layout.stream``): the merger after the tower, and
the window merger inside it ("16x").

Stock's ``Merger.forward`` loops over the crops (``for batch_idx in range(len(target_sizes))``: a view, a permute and
the merge MLPs per crop), and the window merger (``ViTWindowAttentionMerger.forward``) orders each crop's patches by
window and splits its attention by window from tables built per crop (``get_window_index``). Dynamo would unroll
either into a graph per layout, and cannot even start on a crop count it keeps unbacked. In a traced stream forward
each runs inside one operator (``syncfree::minicpm_merger_<n>``, ``syncfree::minicpm_window_merger_<n>``, made by
``recomputed_op``; ``n`` the module's weights) that takes the plan's host crop sizes and calls the module itself: the
same calls in the same order, so the outputs are the eager ones bit for bit (the merger's crops concatenated, as the
forward concatenates them). The window merger runs there on the tables the eager path makes (stock's
``get_window_index`` on the host sizes, moved without a wait: ``navit.merger_tables``). The merger's output rows
are the kind's placeholders (the plan's size carrier); the window merger's, one per window of the patches it takes.

An operator takes no module: the module is found inside it by a key (``_key``: run once while Dynamo traces, a
constant of the graph), from a table that holds it weakly, and runs with the weights the operator takes
(``torch.func.functional_call``: its very calls on those tensors), so a training step's gradients reach them through
the operator's backward, which runs the module again under autograd. An operator is made per number of weights (the
merger's MLPs are ``merger_times`` in number, from the config).
"""

from __future__ import annotations

import inspect
import weakref

import torch

from ...plan import active
from ...rewrite.recomputed_op import recomputed_op
from .navit import MERGER, merger_tables

__all__ = ["merged_crops", "merged_windows"]

_MODULES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_OPS: dict = {}  # (role, number of weights) -> the operator


@torch._dynamo.assume_constant_result
def _key(module, role: str) -> int:
    # (run by Dynamo while it traces, with the module itself: the key is a constant of the graph; the operator of its
    # role and weights is made here, outside the trace, where Dynamo only looks it up)
    _MODULES[id(module)] = module
    _op(role, len(list(module.parameters())))
    return id(module)


def _call(module, weights, hidden: torch.Tensor, sizes: torch.Tensor):
    # (the instance's forward on these weights: the patched one, which outside a trace is stock's on the host sizes)
    names = [name for name, _ in module.named_parameters()]
    return torch.func.functional_call(module, dict(zip(names, weights)), (hidden, sizes))


def _merge(module, weights, hidden, sizes) -> torch.Tensor:
    return torch.cat(_call(module, weights, hidden, sizes), dim=0)


def _merge_windows(module, weights, hidden, sizes) -> torch.Tensor:
    token = MERGER.set(merger_tables(module, sizes, hidden.device))
    try:
        return _call(module, weights, hidden, sizes)
    finally:
        MERGER.reset(token)


def _merged_fake(hidden, rest):
    rows, module = rest[-1], _MODULES[rest[-2]]
    return hidden.new_empty((rows.shape[0], module.mlp[-1].linear_2.out_features))


def _windows_fake(hidden, rest):
    module = _MODULES[rest[-1]]
    window_h, window_w = module.window_kernel_size
    return hidden.new_empty((1, hidden.shape[1] // (window_h * window_w), module.linear_2.out_features))


# role -> (what runs inside, its fake, the size tensors it takes only for the fake)
_ROLES = {"merger": (_merge, _merged_fake, ("rows",)), "window_merger": (_merge_windows, _windows_fake, ())}


def _op(role: str, count: int):
    """The operator of ``role`` over the hidden states and ``count`` weights (the module's parameters, in order)."""
    op = _OPS.get((role, count))
    if op is not None:
        return op
    body, fake, sized_by = _ROLES[role]

    def run(hidden, *rest):
        weights, (sizes, module) = rest[:count], rest[count:]
        return body(_MODULES[module], weights, hidden, sizes)

    tensor = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("hidden", tensor, annotation=torch.Tensor),
                  *(inspect.Parameter(f"weight{i}", tensor, annotation=torch.Tensor) for i in range(count)),
                  inspect.Parameter("sizes", tensor, annotation=torch.Tensor),
                  inspect.Parameter("module", tensor, annotation=int)]
    run.__signature__ = inspect.Signature(parameters, return_annotation=torch.Tensor)
    run.__annotations__ = {**{p.name: p.annotation for p in parameters}, "return": torch.Tensor}
    op = _OPS[role, count] = recomputed_op(f"syncfree::minicpm_{role}_{count}", run,
                                           lambda hidden, *rest: fake(hidden, rest), differentiable=1 + count,
                                           sized_by=sized_by)
    return op


def _registered(role: str, count: int):
    # (the operator ``_key`` made, by its registered name: Dynamo looks ``torch.ops`` up as it traces, where a table
    # of ours would be the one it saw before ``_key`` ran)
    return getattr(torch.ops.syncfree, f"minicpm_{role}_{count}")


def merged_crops(merger, hidden_states: torch.Tensor, sizes: torch.Tensor, kind: str) -> list[torch.Tensor]:
    """Stock's per-crop features as one piece, ``[features]``, by one operator over the host crop sizes ``sizes``
    (``kind``'s crops: "image" or "video"); its rows are the kind's placeholders (the plan's size carrier)."""
    rows = active.current().plan.carriers[f"n_{kind}_tokens"]
    weights = [weight for _, weight in merger.named_parameters()]
    key = _key(merger, "merger")
    return [_registered("merger", len(weights))(hidden_states, *weights, sizes, key, rows)]


def merged_windows(window_merger, hidden_states: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """The window merger's output by one operator over the host crop sizes ``sizes``."""
    weights = [weight for _, weight in window_merger.named_parameters()]
    key = _key(window_merger, "window_merger")
    return _registered("window_merger", len(weights))(hidden_states, *weights, sizes, key)
