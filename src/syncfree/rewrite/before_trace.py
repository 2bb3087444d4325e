"""The prepared batch's presence check, run before ``torch.compile`` traces the model's forward.

Inside a traced forward a ``StalePlan`` is an exception Dynamo observes: with ``fullgraph=True`` the user gets
Dynamo's "Unsupported: Observed exception", with syncfree's one line buried in its debug context. A compiled
module runs its forward pre-hooks outside Dynamo ("invoke hooks outside of dynamo then pick up the inner frame",
``OptimizedModule``), so the check that needs no device value (which control tensors the call passes, against the
ones the plan was made from) runs here first, eagerly, and raises syncfree's own error as it would without compile.
The hook is ``torch.compiler.disable``-d: Dynamo never traces it. In eager it repeats a check the patched forward
makes anyway (a dict walk; no tensor op).
"""

from __future__ import annotations

import inspect

import torch

from ..plan import active
from ..plan.batch import plan_inputs
from .call_args import given_args, positional_names, taken_inputs

__all__ = ["add_presence_check", "remove_presence_check"]

_HANDLE = "_syncfree_presence_check"  # the hook's handle, in the module's __dict__ (removed by unpatch)


def add_presence_check(model: torch.nn.Module) -> None:
    """Register the check on ``model`` (the module a user calls and compiles), where its forward names the tokens."""
    forward = type(model).forward
    if _HANDLE in model.__dict__ or "input_ids" not in inspect.signature(forward).parameters:
        return
    names, taken = positional_names(forward), taken_inputs(forward, plan_inputs())

    @torch.compiler.disable
    def check(module, args, kwargs):
        given = given_args(names, args, kwargs)
        anchor = given.get("input_ids")
        plan = active.attached(anchor if anchor is not None else given.get("mm_token_type_ids"))
        if plan is not None:
            # (a control input the forward takes and the call leaves out is None there)
            plan.check_present({**dict.fromkeys(taken), **given})

    model.__dict__[_HANDLE] = model.register_forward_pre_hook(check, with_kwargs=True)


def remove_presence_check(model: torch.nn.Module) -> None:
    handle = model.__dict__.pop(_HANDLE, None)
    if handle is not None:
        handle.remove()
