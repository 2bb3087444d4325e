"""Vision attention's split sizes, without a read per block: the one piece both the rewritten attention
(``helpers``) and the attention backends (``attention``) need, kept below both."""

from __future__ import annotations

import weakref

import torch

__all__ = ["segment_lengths"]


_read_lengths: dict[int, tuple] = {}  # id(cu_seqlens) -> (weakref, _version, sizes): one read per tensor


def segment_lengths(lengths: torch.Tensor, cu_seqlens: torch.Tensor, seqlens) -> list[int]:
    """Vision attention's split sizes (stock: ``lengths.tolist()`` in every block, for q, k and v).

    The plan's host ints when the tower passed them (keyed by how many segments ``cu_seqlens``
    describes: full and window segmentations alternate in Qwen2.5-VL). Otherwise the sizes are read
    once per ``cu_seqlens`` tensor (a tower hands the same one to every block) and kept while that
    tensor lives unchanged: one wait per tower call instead of three per block.
    """
    if seqlens is not None:
        sizes = seqlens.get(cu_seqlens.shape[0]) if isinstance(seqlens, dict) else seqlens
        if sizes is not None and len(sizes) + 1 == cu_seqlens.shape[0]:
            return list(sizes)
    if torch.compiler.is_compiling() or cu_seqlens.device.type == "cpu":
        return lengths.tolist()
    key = id(cu_seqlens)
    kept = _read_lengths.get(key)
    if kept is not None and kept[0]() is cu_seqlens and kept[1] == cu_seqlens._version:
        return list(kept[2])
    sizes = lengths.tolist()  # the one read
    _read_lengths[key] = (weakref.ref(cu_seqlens, lambda _r, k=key, d=_read_lengths: d.pop(k, None)),
                          cu_seqlens._version, tuple(sizes))
    return sizes
