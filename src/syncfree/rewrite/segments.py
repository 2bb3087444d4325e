"""Vision attention's split sizes, without a read per block: the one piece both the rewritten attention
(``helpers``) and the attention backends (``attention``) need, kept below both."""

from __future__ import annotations

import weakref

import torch

__all__ = ["segment_lengths", "TracedSegments", "HostLengths", "TracedWindows"]


class TracedSegments:
    """What a traced forward's tower hands its attention layers instead of the plan's size tuples: for each
    segmentation (full, windows), the ``cu_seqlens`` tensor the layers are given and the segment lengths as a host
    tensor (``VisionPlan.host_seqlens``) and as the plan's tuple. A layer finds its segmentation by the identity of
    the ``cu_seqlens`` it is handed, which a traced forward keeps."""

    def __init__(self, pairs, by_length, derived=None) -> None:
        # ((cu_seqlens, host lengths, the sizes as a function: read only where the operator does not serve), ...)
        self.pairs = tuple(pairs)
        # The plan's sizes keyed by how many segments a ``cu_seqlens`` describes (``VisionPlan.seqlens_by_length``), as
        # a function: for a ``cu_seqlens`` the tower derived (a class token per segment), found as in eager.
        self.by_length = by_length
        # (host lengths, sizes) of the one segmentation a tower derives its layers' ``cu_seqlens`` from (a class token
        # per segment, counted in the host lengths): for a ``cu_seqlens`` not found by identity, where there is no
        # other segmentation (a length looked up in ``by_length`` would be a graph per segment count).
        self.derived = derived

    def find(self, cu_seqlens):
        for cu, host, sizes in self.pairs:
            if cu is cu_seqlens:
                return host, sizes
        return self.derived


class HostLengths:
    """The split a traced attention layer leaves to the segment operator: the host lengths, and the plan's sizes
    for an attention the operator does not serve (``split`` then splits by them, as the eager path does)."""

    def __init__(self, host: torch.Tensor, sizes) -> None:
        self.host, self.sizes = host, sizes  # (sizes: a function returning the tuple)


_read_lengths: dict[int, tuple] = {}  # id(cu_seqlens) -> (weakref, _version, sizes): one read per tensor


def segment_lengths(lengths: torch.Tensor, cu_seqlens: torch.Tensor, seqlens) -> list[int]:
    """Vision attention's split sizes (stock: ``lengths.tolist()`` in every block, for q, k and v).

    The plan's host ints when the tower passed them (keyed by how many segments ``cu_seqlens``
    describes: full and window segmentations alternate in a tower with window attention). Otherwise the sizes are read
    once per ``cu_seqlens`` tensor (a tower hands the same one to every block) and kept while that
    tensor lives unchanged: one wait per tower call instead of three per block.
    """
    if isinstance(seqlens, TracedSegments):
        found = seqlens.find(cu_seqlens)
        if found is not None:
            return list(found[1]())
        seqlens = seqlens.by_length()
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


class TracedWindows:
    """The ``max_seqlen`` a traced audio encoder hands its layers instead of the plan's ``SegmentedMax``: its windows
    as ``TracedSegments`` (``.seqlens``, where the attention's split looks for them), and no int, which would make a
    graph per longest window. Only the split reads it: the stock attention reads ``max_seqlen`` on its flash path
    alone, for which the encoder's wrapper hands over the plan's int instead."""

    def __init__(self, cu_seqlens: torch.Tensor, host: torch.Tensor, sizes: tuple) -> None:
        self.seqlens = TracedSegments([(cu_seqlens, host, lambda: sizes)], lambda: {len(sizes) + 1: sizes})
