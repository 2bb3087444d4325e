"""The audio side of a plan (``AudioLayout.encoder``): what the audio encoder derives from ``feature_attention_mask``.

Stock reads the device several times per audio-encoder call to lay the mel frames out: the frames
kept by the mask (boolean indexing), the chunk sizes (``chunk_lengths.tolist()``), the longest chunk
after the convolutions (``.max().item()``), the valid output frames (``nonzero``), the attention
windows (a Python loop over device lengths) and, in every encoder layer, the window sizes
(``lengths.tolist()``). All of it follows from the per-clip frame counts, which the processor returns
on the host. Here it is computed once, on the host, with the installed Transformers' own helpers
(so the numbers are stock's), and moved with the rest of the plan.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from .tensors import DeviceFields

__all__ = ["AudioPlan", "audio_plan", "audio_plan_from_lengths", "SegmentedMax"]


class SegmentedMax(int):
    """The longest attention window, as the int stock passes as ``max_seqlen``, carrying all the window sizes.

    The audio encoder hands its layers only ``cu_seqlens`` and ``max_seqlen`` (the windowed encoder passes no
    other keyword), so this is how the planned sizes reach the split in every layer: an int wherever stock
    uses the value, and ``.seqlens`` for the rewritten split."""

    seqlens: tuple[int, ...]

    def __new__(cls, value: int, seqlens: tuple[int, ...]):
        obj = super().__new__(cls, value)
        obj.seqlens = tuple(seqlens)
        return obj

    def __reduce__(self):  # (plans travel from DataLoader workers)
        return SegmentedMax, (int(self), self.seqlens)


@dataclass
class AudioPlan(DeviceFields):
    feature_lens: torch.Tensor  # (clips,) mel frames per clip, on the host (stock: feature_attention_mask.sum(1))
    chunk_sizes: tuple[int, ...]  # frames per encoder chunk, as host ints
    chunk_lengths: torch.Tensor  # (chunks,) frames per encoder chunk (a pooling encoder masks the padded chunks with it)
    seqlens: tuple[int, ...]  # attention window sizes after the convolutions
    max_seqlen: SegmentedMax  # made with the plan, so a compiled encoder gets it as an input, not a new object
    cu_seqlens: torch.Tensor  # (windows + 1,) int32
    valid_indices: torch.Tensor  # output frames kept from the padded chunks
    frame_positions: torch.Tensor | None  # flat positions of the mask's ones (None: planned from lengths alone)
    n_frames: int  # ones in feature_attention_mask
    n_outputs: int  # encoder output frames: what the audio placeholders must number
    pool_indices: torch.Tensor | None = None  # a pooling encoder's stride-2 average pooling after the layers
    device: str = "cpu"
    # (the window sizes as a host tensor: what a traced encoder's attention operator splits by; it stays on the host)
    host_seqlens: torch.Tensor | None = field(default=None, compare=False, repr=False)
    # (an empty host tensor (longest chunk, 0): the padded chunks' width as a size a traced encoder takes, not a value)
    chunk_width: torch.Tensor | None = field(default=None, compare=False, repr=False)

    _TENSORS = ("chunk_lengths", "cu_seqlens", "valid_indices", "frame_positions", "pool_indices")

    def encoder_kwargs(self, input_features: torch.Tensor) -> dict:
        """What the stock audio encoder pops from its kwargs instead of deriving it from the device lengths."""
        # Stock's chunking (the end of chunk_and_pad_features) with the planned sizes: host ints, nothing waits.
        chunks = input_features.T.split(list(self.chunk_sizes), dim=0)
        return self._planned(torch.nn.utils.rnn.pad_sequence(chunks, batch_first=True).transpose(1, 2))

    def traced_encoder_kwargs(self, input_features: torch.Tensor) -> dict:
        """``encoder_kwargs`` for a traced encoder: the padded chunks gathered by index from the chunks' lengths and
        the longest chunk's width (a size), not split by host ints, so that one graph takes chunks of any sizes. The
        same values in the same layout as stock's ``pad_sequence`` (a chunk's frames, then zeros)."""
        steps = torch.arange(self.chunk_width.shape[0], device=input_features.device)
        lengths = self.chunk_lengths
        index = ((lengths.cumsum(0) - lengths)[:, None] + steps).clamp(max=input_features.shape[1] - 1)
        frames = input_features.T[index]  # (chunks, width, bins), as pad_sequence stacks them
        padded = torch.where((steps < lengths[:, None])[..., None], frames, frames.new_zeros(()))
        return self._planned(padded.transpose(1, 2))

    def _planned(self, padded: torch.Tensor) -> dict:
        # max_seqlen: stock computes it for flash attention only (None otherwise, unused by the split path).
        kwargs = {"padded_feature": padded, "chunk_lengths": self.chunk_lengths, "valid_indices": self.valid_indices,
                  "cu_seqlens": self.cu_seqlens, "max_seqlen": self.max_seqlen}
        if self.pool_indices is not None:
            kwargs["pool_indices"] = self.pool_indices
        return kwargs

    def layout_dims(self, inputs: dict, host: dict, spec) -> list:
        """The dimensions of this plan's and its inputs' tensors that follow the layout, for a stream's graph
        (``dynamic_dims``): the clips (unbacked, so one clip makes no graph of its own) and their mel frames
        (``input_features``, ``feature_attention_mask``), the chunks (unbacked; dynamic where the encoder convolves
        them in groups, ``spec.audio_conv_chunks``, whose count the graph compares with the group, which it can only
        do with a count Dynamo knows a hint of: one chunk then compiles apart) and the longest chunk, the windows, the
        kept and valid frames, and the output frames, which are the audio placeholders' count (one symbol for both).
        The mel bins stay static."""
        clips = {0: "syncfree.audio.clips"}
        found = [(t, {"dynamic": (t.dim() - 1,), "per_item": clips})
                 for t in (inputs.get("input_features"), inputs.get("feature_attention_mask"),
                           host.get("feature_attention_mask")) if isinstance(t, torch.Tensor) and t.dim() >= 2]
        outputs = "syncfree.n_audio_tokens"
        found += [(self.feature_lens, {"per_item": clips}),
                  (self.chunk_lengths, {"dynamic": (0,)} if spec.audio_conv_chunks else
                   {"per_item": {0: "syncfree.audio.chunks"}}),
                  (self.chunk_width, {"dynamic": (0,)}),
                  (self.cu_seqlens, {"per_item": {0: "syncfree.audio.windows+1"}}),
                  (self.host_seqlens, {"per_item": {0: "syncfree.audio.windows"}}),
                  (self.valid_indices, {"per_item": {0: "syncfree.audio.valid" if self.pool_indices is not None
                                                     else outputs}})]
        if self.frame_positions is not None:
            found.append((self.frame_positions, {"per_item": {0: "syncfree.audio.frames"}}))
        if self.pool_indices is not None:
            found.append((self.pool_indices, {"per_item": {0: outputs}}))
        return found


def audio_plan_from_lengths(feature_lens: torch.Tensor, module_name: str, n_window: int, n_window_infer: int,
                            mask: torch.Tensor | None = None) -> AudioPlan:
    """Plan the audio encoder from host per-clip frame counts (and the host mask they came from, if any)."""
    module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    lens = feature_lens.to("cpu", torch.long)
    if lens.dim() != 1 or bool((lens <= 0).any()):
        raise ValueError(f"audio feature lengths must be positive, one per clip, got {lens.tolist()}")
    # Stock's chunking on a shapeless stand-in for the features: only the lengths matter.
    stand_in = torch.empty(1, int(lens.sum()), device="meta")
    _, chunk_lengths = module.chunk_and_pad_features(stand_in, lens, n_window)
    pool = None
    if hasattr(module, "get_pool_indices"):  # a pooling encoder: attention per chunk after one conv, then pooling
        valid = module.get_valid_indices(chunk_lengths)
        cu = module.get_audio_cu_seqlens(chunk_lengths)
        pool = module.get_pool_indices(lens)
    else:  # a windowed encoder: three convs per chunk, attention in windows of n_window_infer frames
        valid = module.get_valid_indices(chunk_lengths, n_window)
        cu = module.get_audio_cu_seqlens(chunk_lengths, lens, n_window_infer, n_window)
    seqlens = tuple((cu[1:] - cu[:-1]).tolist())  # host tensors: no device involved
    positions = None
    if mask is not None:
        positions = mask.reshape(-1).nonzero().reshape(-1)
    return AudioPlan(feature_lens=lens, chunk_sizes=tuple(chunk_lengths.tolist()), chunk_lengths=chunk_lengths,
                     seqlens=seqlens, max_seqlen=SegmentedMax(max(seqlens), seqlens),
                     cu_seqlens=cu, valid_indices=valid, frame_positions=positions, n_frames=int(lens.sum()),
                     n_outputs=int(pool.numel() if pool is not None else valid.numel()), pool_indices=pool,
                     host_seqlens=torch.tensor(seqlens, dtype=torch.int64),
                     chunk_width=torch.empty((int(chunk_lengths.max()), 0)))


def audio_plan(feature_attention_mask: torch.Tensor, module_name: str, n_window: int, n_window_infer: int) -> AudioPlan:
    """Plan the audio encoder from the processor's host ``feature_attention_mask`` (clips, frames)."""
    mask = feature_attention_mask
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("feature_attention_mask must be a tensor of shape (clips, frames), got "
                         f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    mask = mask.to("cpu")
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("feature_attention_mask must hold only 0 and 1")
    return audio_plan_from_lengths(mask.sum(1), module_name, n_window, n_window_infer, mask=mask)
