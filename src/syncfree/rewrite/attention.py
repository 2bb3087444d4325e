"""How the patched vision attention runs its segments (images, video frames, windows): the backends.

Stock runs one attention call per segment, per layer (a 64-frame video at the 8B shape: 32 segments
x 27 layers = 864 calls). The backend is chosen per model with ``syncfree.patch(model,
vision_attention=...)``; every one is sync-free (sizes come from tensor shapes and the plan, on the
host):

* ``split``: one call per segment, exactly as stock (the default; bit-identical).
* ``grouped``: each run of consecutive equal-length segments (a video's frames, a row of same-size
  images) is one batched call over a view of q/k/v (no copy): the same numbers, fewer launches.
* ``block_diagonal``: one call over the whole packed sequence with a block-diagonal mask (built on
  the device from ``cu_seqlens``). Quadratic in the total length: memory and compute grow with the
  square of all patches, not of each segment.
* ``varlen``: PyTorch's variable-length flash kernel (``torch.nn.attention.varlen``, PyTorch >= 2.10,
  CUDA, bfloat16/float16): one kernel for all segments.
* ``auto``: ``varlen`` where it can run, else ``grouped`` when neighbouring segments share a length, else
  ``split``; never ``block_diagonal`` (see the crossover data in docs/benchmarks.md).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from .segment_op import op_applies, segment_attention_op
from .segments import HostLengths, TracedSegments, segment_lengths

__all__ = ["BACKENDS", "AttentionChoice", "segment_attention", "segment_attention_with_weights", "split_segments",
           "check_backend"]

BACKENDS = ("split", "grouped", "block_diagonal", "varlen", "auto")


def varlen_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def check_backend(name: str) -> str:
    """``name`` if it is a backend, else a ValueError naming the choices."""
    if name not in BACKENDS:
        raise ValueError(f"vision_attention must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "varlen" and not varlen_available():
        raise ValueError(f"vision_attention='varlen' needs PyTorch 2.10 or newer (torch.nn.attention.varlen); this "
                         f"is {torch.__version__}: use 'grouped' or 'auto'")
    return name


@dataclass(frozen=True)
class AttentionChoice:
    """The backend a vision tower call runs with, handed to its attention layers in ``kwargs``."""

    backend: str = "split"

    def whole_sequence(self, q: torch.Tensor, training: bool) -> bool:
        """True when the backend attends over the packed sequence at once (no split by segment needed)."""
        return self.backend == "block_diagonal" or (
            self.backend in ("varlen", "auto") and self.mode(None, q, training) == "varlen")

    def mode(self, sizes: tuple[int, ...] | None, q: torch.Tensor, training: bool) -> str:
        backend = self.backend
        if backend == "varlen" and (q.device.type != "cuda" or q.dtype not in (torch.bfloat16, torch.float16)):
            raise ValueError(f"vision_attention='varlen' runs PyTorch's flash kernel, which needs a CUDA device and "
                             f"bfloat16 or float16 tensors (got {q.device.type}, {q.dtype}); use 'grouped' or 'auto'")
        if backend == "auto":
            if (varlen_available() and q.device.type == "cuda" and q.dtype in (torch.bfloat16, torch.float16)
                    and not training):
                return "varlen"
            if sizes is None:
                return "split"
            return "grouped" if any(a == b for a, b in zip(sizes, sizes[1:])) else "split"
        if backend == "varlen" and training:
            return "split"  # the kernel has no dropout; a vision tower in training mode may use it
        return backend


_runs_cache: dict[tuple[int, ...], list[tuple[int, int, int]]] = {}


def _runs(sizes: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive segments of one length: (first segment, count, length). Host work, cached."""
    found = _runs_cache.get(sizes)
    if found is None:
        found = []
        for i, n in enumerate(sizes):
            if found and found[-1][2] == n:
                first, count, _ = found[-1]
                found[-1] = (first, count + 1, n)
            else:
                found.append((i, 1, n))
        if len(_runs_cache) > 64:
            _runs_cache.clear()
        _runs_cache[sizes] = found
    return found


def _grouped(call, splits, qkv, eager: bool) -> list[torch.Tensor]:
    """One call per run of equal-length segments (a video's frames, a row of same-size images).

    A run is contiguous in the packed sequence, so its segments are a view of q/k/v with the run as
    the batch dimension: (1, heads, count * length, d) -> (count, heads, length, d). SDPA takes the
    view as it is; eager attention's matmul takes another BLAS path for such strides (results off in
    the last bit), so it gets a contiguous copy, with which it computes exactly what stock computes.
    """
    sizes = tuple(s.shape[2] for s in splits[0])
    outputs = []
    offset = 0
    for first, count, length in _runs(sizes):
        if count == 1:
            outputs.append(call(splits[0][first], splits[1][first], splits[2][first]))
        else:
            q, k, v = (t[:, :, offset:offset + count * length].squeeze(0).unflatten(1, (count, length)).transpose(0, 1)
                       for t in qkv)
            if eager:
                q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            out = call(q, k, v)  # (count, length, heads, d)
            outputs.append(out.reshape(1, count * length, *out.shape[2:]))
        offset += count * length
    return outputs


def _block_diagonal(call, qkv, cu_seqlens, eager: bool) -> list[torch.Tensor]:
    q = qkv[0]
    total = q.shape[2]
    # Segment id of every position, on the device, from cu_seqlens (no host read): one mask per call.
    ids = torch.searchsorted(cu_seqlens[1:].to(torch.int64), torch.arange(total, device=q.device), right=True)
    mask = (ids[:, None] == ids[None, :])[None, None]
    if eager:  # eager attention adds its mask: 0 inside a segment, the dtype's lowest value outside
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, torch.finfo(q.dtype).min)
    return [call(*qkv, attention_mask=mask)]


def _varlen(qkv, cu_seqlens, longest: int, scaling) -> list[torch.Tensor]:
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = (t.squeeze(0).transpose(0, 1) for t in qkv)  # (1, heads, n, d) -> (n, heads, d)
    if k.shape[1] != q.shape[1]:  # grouped-query attention in a tower: each key/value head serves a group
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    cu = cu_seqlens.to(torch.int32)
    out = varlen_attn(q, k, v, cu, cu, longest, longest, scale=scaling)
    return [out.unsqueeze(0)]  # (1, n, heads, d), as the attention functions return


def split_segments(lengths, cu_seqlens, seqlens, choice, qkv, training: bool = False):
    """Stock's split of q, k and v by segment (the sizes from the plan, see ``helpers.segment_lengths``),
    or None when the backend attends over the whole packed sequence and needs no split."""
    if choice is not None and choice.whole_sequence(qkv[0], training):
        return None
    if isinstance(seqlens, TracedSegments) and (choice is None or choice.backend in ("split", "grouped")):
        found = seqlens.find(cu_seqlens)
        if found is not None:
            return HostLengths(*found)  # (split by segment_attention: by the operator, or by these sizes)
    sizes = segment_lengths(lengths, cu_seqlens, seqlens)
    return [torch.split(tensor, sizes, dim=2) for tensor in qkv]


def segment_attention(call, splits, qkv, cu_seqlens, choice, scaling=None, training: bool = False,
                      eager: bool = False, max_seqlen=None, module=None) -> list[torch.Tensor]:
    """The per-segment attention outputs (stock's ``attn_outputs``), by the chosen backend.

    ``call(q, k, v, attention_mask=None)`` is stock's attention call; ``splits`` stock's q/k/v split by
    segment (None for the whole-sequence backends); ``qkv`` the unsplit q/k/v; the outputs are
    concatenated along the sequence by stock.

    In a traced forward (``splits``: ``HostLengths``) the segments of the split backends run as one operator
    (``segment_op``: the same calls, the graph independent of the layout) where it serves ``module``'s attention;
    otherwise split by the plan's sizes as in eager.
    """
    if isinstance(splits, HostLengths):
        if module is not None and op_applies(module):
            return [segment_attention_op(module, qkv, splits.host, scaling)]
        splits = [torch.split(tensor, list(splits.sizes()), dim=2) for tensor in qkv]
    if choice is None or choice.backend == "split":
        return [call(q, k, v) for q, k, v in zip(*splits)]
    if splits is None:  # block_diagonal, or varlen
        if choice.backend == "block_diagonal":
            return _block_diagonal(call, qkv, cu_seqlens, eager)
        longest = max_seqlen if isinstance(max_seqlen, int) else qkv[0].shape[2]
        return _varlen(qkv, cu_seqlens, longest, scaling)
    sizes = tuple(s.shape[2] for s in splits[0])
    if choice.mode(sizes, qkv[0], training) == "grouped":
        return _grouped(call, splits, qkv, eager)
    return [call(q, k, v) for q, k, v in zip(*splits)]


def segment_attention_with_weights(call, splits, qkv, cu_seqlens, choice, scaling=None, training: bool = False,
                                   eager: bool = False, max_seqlen=None, module=None,
                                   masked: bool = False) -> tuple[list, list]:
    """``segment_attention`` for an attention that also collects each segment's weights (``call`` returns
    ``(output, weights)``): stock's two lists with stock's split; other backends give no per-segment weights
    (None for each output: what SDPA gives stock too).

    In a traced forward (``splits``: ``HostLengths``) an SDPA attention's segments run as one operator, as in
    ``segment_attention``, with one None for the weights of all of them (SDPA's calls give None for each); an eager
    attention's weights need a call per segment, and a call with a mask of its own (``masked``) its mask: split by
    the plan's sizes as in eager."""
    if isinstance(splits, HostLengths):
        if not eager and not masked and module is not None and op_applies(module):
            return [segment_attention_op(module, qkv, splits.host, scaling)], [None]
        splits = [torch.split(tensor, list(splits.sizes()), dim=2) for tensor in qkv]
    if choice is None or choice.backend == "split":
        pairs = [call(q, k, v) for q, k, v in zip(*splits)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    outputs = segment_attention(lambda q, k, v, attention_mask=None: call(q, k, v, attention_mask=attention_mask)[0],
                                splits, qkv, cu_seqlens, choice, scaling=scaling, training=training, eager=eager,
                                max_seqlen=max_seqlen)
    return outputs, [None] * len(outputs)
