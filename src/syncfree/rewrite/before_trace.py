"""What a patched model sets up before ``torch.compile`` traces its forward: the prepared batch's presence check, and
the output-recording hooks of a tower that is asked for its hidden states on every call.

Inside a traced forward a ``StalePlan`` is an exception Dynamo observes: with ``fullgraph=True`` the user gets
Dynamo's "Unsupported: Observed exception", with syncfree's one line buried in its debug context. A compiled
module runs its forward pre-hooks outside Dynamo ("invoke hooks outside of dynamo then pick up the inner frame",
``OptimizedModule``), so the check that needs no device value (which control tensors the call passes, against the
ones the plan was made from) runs here first, eagerly, and raises syncfree's own error as it would without compile.
The hook is ``torch.compiler.disable``-d: Dynamo never traces it. In eager it repeats a check the patched forward
makes anyway (a dict walk; no tensor op).
"""

from __future__ import annotations

import functools
import inspect

import torch

from ..plan import active
from ..plan.batch import plan_inputs
from .call_args import given_args, positional_names, taken_inputs

__all__ = ["add_presence_check", "remove_presence_check", "install_output_recording"]


@functools.lru_cache(maxsize=None)
def _names(forward) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A forward's positional names and the control inputs it takes (once per forward function)."""
    return positional_names(forward), taken_inputs(forward, plan_inputs())


@torch.compiler.disable
def check_before_trace(module, args, kwargs):
    """The forward pre-hook: a prepared call's control inputs against its plan's (a module-level function, so a patched
    model still pickles: ``torch.save``, ``copy.deepcopy``, DataLoader and multiprocessing workers)."""
    names, taken = _names(type(module).forward)
    given = given_args(names, args, kwargs)
    anchor = given.get("input_ids")
    plan = active.attached(anchor if anchor is not None else given.get("mm_token_type_ids"))
    if plan is not None:
        # (a control input the forward takes and the call leaves out is None there)
        plan.check_present({**dict.fromkeys(taken), **given})


def _has_check(model: torch.nn.Module) -> bool:
    return any(hook is check_before_trace for hook in model._forward_pre_hooks.values())


def add_presence_check(model: torch.nn.Module) -> None:
    """Register the check on ``model`` (the module a user calls and compiles), where its forward names the tokens."""
    if _has_check(model) or "input_ids" not in inspect.signature(type(model).forward).parameters:
        return
    model.register_forward_pre_hook(check_before_trace, with_kwargs=True)


def remove_presence_check(model: torch.nn.Module) -> None:
    for key, hook in list(model._forward_pre_hooks.items()):
        if hook is check_before_trace:
            del model._forward_pre_hooks[key]
            model._forward_pre_hooks_with_kwargs.pop(key, None)


def install_output_recording(tower: torch.nn.Module) -> None:
    """Install Transformers' output-recording hooks on ``tower`` now, as stock's first call asking for hidden states
    would (``maybe_install_capturing_hooks``: once per module, inactive unless a call asks). That first call, traced,
    would break the graph twice: at the installation's lock and at the hooks' registration. A release without the
    helper records outputs otherwise: nothing to install."""
    try:
        from transformers.utils.output_capturing import maybe_install_capturing_hooks
    except ImportError:
        return
    maybe_install_capturing_hooks(tower)
