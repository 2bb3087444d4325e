"""A stand-in for flash-linear-attention's gated delta rule kernels (no CPU build exists): records its arguments."""
import torch

SEEN = []

def _record(name, kwargs):
    SEEN.append({k: (type(v).__name__, str(v.device)) if isinstance(v, torch.Tensor) else type(v).__name__
                 for k, v in kwargs.items()} | {"fn": name})

def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    _record("chunk", dict(cu_seqlens=cu_seqlens, initial_state=initial_state))
    state = q.new_zeros(q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1, v.shape[2], k.shape[3], v.shape[3])
    return torch.zeros_like(v), state if output_final_state else None

def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                     cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    _record("recurrent", dict(cu_seqlens=cu_seqlens, initial_state=initial_state))
    return torch.zeros_like(v), initial_state
