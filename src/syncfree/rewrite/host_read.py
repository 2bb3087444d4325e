"""The deliberate host work when the user skipped ``prepare()``: one read of the control tensors, and
sending the plan made from them back to the device. Audits show both at their lines here, by name."""

from __future__ import annotations

import torch

__all__ = ["read_to_host_syncs_once", "send_plan_back"]


def read_to_host_syncs_once(tensors: dict) -> dict:
    """Copy every device tensor in ``tensors`` to the host, waiting for the device exactly once.

    All copies are queued as non-blocking copies into pinned memory, then one
    synchronize waits for them together, instead of one blocking read each.
    """
    on_device = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor) and v.device.type != "cpu"}
    if not on_device:
        return dict(tensors)
    if {v.device.type for v in on_device.values()} == {"cuda"}:
        host = {k: v.to("cpu", non_blocking=True) for k, v in on_device.items()}
        torch.cuda.synchronize()
    else:  # other accelerators: a blocking copy each (still correct, just not a single wait)
        host = {k: v.to("cpu") for k, v in on_device.items()}
    return {**tensors, **host}


def send_plan_back(plan, device):
    """The plan's tensors to ``device`` with pinned, non-blocking copies (queued: no wait)."""
    return plan.to(device)
