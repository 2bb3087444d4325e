"""A varlen attention for the vision towers from PyTorch's own flash kernel, for the bench's "varlen" variant.

The flash-attn package is often not installed (it is not on our GPU image), but PyTorch 2.10 and
newer ship a variable-length flash kernel as ``torch.nn.attention.varlen.varlen_attn`` (CUDA only).
Registered with Transformers under a name holding "flash", it sends the vision attention down its
``cu_seqlens`` path: one kernel per layer over every image and frame, instead of one SDPA call per
segment. Only the vision tower is switched; the text model keeps its own implementation.
"""

from __future__ import annotations

import importlib.util

import torch

from ..presets import vision_tower_of

__all__ = ["VARLEN", "VARLEN_ATTN", "torch_varlen_attention", "use_torch_varlen", "varlen_problem"]

VARLEN = "varlen"  # what the bench calls it (--attn varlen)
VARLEN_ATTN = "syncfree_torch_flash_varlen"  # what Transformers calls it: "flash" selects the cu_seqlens path


def torch_varlen_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                           cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None,
                           is_causal=False, **kwargs):
    """Transformers' attention-function signature over ``varlen_attn``; no host read (the max lengths are ints)."""
    from torch.nn.attention.varlen import varlen_attn

    if cu_seq_lens_q is None or max_length_q is None:
        raise ValueError(f"{VARLEN_ATTN} is for packed sequences (cu_seqlens and max_seqlen), as the vision "
                         "towers pass them; it cannot serve a padded batch")
    if is_causal or attention_mask is not None or dropout:
        raise ValueError(f"{VARLEN_ATTN} does full, mask-free attention without dropout, as the vision towers need")
    # Transformers hands (1, heads, tokens, head_dim); the kernel takes (tokens, heads, head_dim).
    q, k, v = (t.squeeze(0).transpose(0, 1) for t in (query, key, value))
    cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    out = varlen_attn(q, k, v, cu_seq_lens_q, cu_k, max_length_q, max_length_q if max_length_k is None
                      else max_length_k, scale=scaling)
    return out.unsqueeze(0), None  # (1, tokens, heads, head_dim), as Transformers' attention functions return


def varlen_problem(device: str, dtype: str = "bfloat16") -> str | None:
    """Why the varlen variant cannot run here, or None when it can."""
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return f"--attn {VARLEN} needs PyTorch 2.10 or newer (torch.nn.attention.varlen); this is {torch.__version__}"
    if device != "cuda":
        return f"--attn {VARLEN} runs PyTorch's flash kernel, which needs a CUDA device (got --device {device})"
    if dtype not in ("bfloat16", "float16"):
        return f"--attn {VARLEN} runs PyTorch's flash kernel, which takes bfloat16 or float16 (got --dtype {dtype})"
    return None


def use_torch_varlen(model) -> None:
    """Switch ``model``'s vision tower (a Qwen-VL model or the tower itself) to ``torch_varlen_attention``.

    Set on the built model: at build time Transformers would look for the flash-attn package.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_ATTN, torch_varlen_attention)
    try:
        visual = vision_tower_of(model)
    except ValueError:  # a vision tower alone
        visual = model
    visual.config._attn_implementation = VARLEN_ATTN
