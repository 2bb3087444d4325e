"""Qwen3-ASR's part of a plan (its ``PlanHooks``): its audio encoder's, from the processor's ``input_features_mask``.

Stock reads the device three ways per encoder call to lay the mel frames out: the attention windows
(``get_audio_cu_seqlens``: ``.max().item()``, a Python loop over device lengths, then an upload), the valid
output frames of the padded chunks (``nonzero``), and, in every encoder layer, the window sizes
(``lengths.tolist()``). All of it follows from the mask, which the processor returns on the host. Here it is
computed once, on the host, by the installed Transformers' own helpers on a host copy of that mask (so the
numbers are stock's), and moved with the rest of the plan.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch

from ...plan.audio import SegmentedMax
from ...plan.hooks import PlanHooks
from ...plan.tensors import DeviceFields

__all__ = ["MaskedAudioPlan", "masked_audio_plan", "PLAN"]

_ENCODER = "Qwen3ASREncoder"


@dataclass
class MaskedAudioPlan(DeviceFields):
    feature_lens: torch.Tensor  # (clips,) real mel frames per clip, on the host (stock: input_features_mask.sum(-1))
    mask_shape: tuple[int, int]  # the (clips, frames) mask this plan was made from
    seqlens: tuple[int, ...]  # attention window sizes after the convolutions
    max_seqlen: SegmentedMax  # the longest window, carrying all the sizes to the split in every encoder layer
    cu_seqlens: torch.Tensor  # (windows + 1,) int32, as stock's get_audio_cu_seqlens returns them
    valid_shape: tuple[int, int]  # (chunks, output frames per chunk): stock's valid_mask
    valid_indices: torch.Tensor  # flat positions of the valid output frames (stock: valid_mask's nonzero)
    n_outputs: int  # encoder output frames: what the audio placeholders must number
    device: str = "cpu"
    # (the window sizes as a host tensor: what a traced encoder's attention operator splits by, a size Dynamo keeps
    # dynamic; it stays on the host)
    host_seqlens: torch.Tensor | None = field(default=None, compare=False, repr=False)

    _TENSORS = ("cu_seqlens", "valid_indices")

    def encoder_kwargs(self) -> dict:
        """What the stock encoder pops from its kwargs (``cu_seqlens``, ``max_seqlen``) instead of deriving it from
        the device mask, and the valid frames' positions for the rewritten select (``syncfree_valid_indices``)."""
        return {"cu_seqlens": self.cu_seqlens, "max_seqlen": self.max_seqlen,
                "syncfree_valid_indices": (self.valid_shape, self.valid_indices)}

    def layout_dims(self, inputs: dict, host: dict, spec) -> list:
        """The dimensions of this plan's and its inputs' tensors that follow the layout, for a stream's graph
        (``plan.dynamic_dims``): the clips and their mel frames (``input_features``, ``input_features_mask``: a
        multiple of the chunk, which stock checks), the windows, and the output frames, which are the audio
        placeholders' count (one symbol for both). The mel bins stay static. (``spec``: the model's; nothing of it
        decides these.)"""
        found = [(t, {"dynamic": (0, t.dim() - 1)}) for t in (inputs.get("input_features"),
                                                               inputs.get("input_features_mask"),
                                                               host.get("input_features_mask"))
                 if isinstance(t, torch.Tensor) and t.dim() >= 2]
        return found + [(self.cu_seqlens, {"per_item": {0: "syncfree.audio.windows+1"}}),
                        (self.host_seqlens, {"per_item": {0: "syncfree.audio.windows"}}),
                        (self.valid_indices, {"per_item": {0: "syncfree.n_audio_tokens"}})]


def masked_audio_plan(mask: torch.Tensor, module_name: str, encoder: str, n_window: int,
                      n_window_infer: int) -> MaskedAudioPlan | None:
    """Plan the encoder from the processor's host ``input_features_mask`` (clips, frames), by stock's own code; None
    where stock refuses the batch (frames not a multiple of its chunk), so that stock raises its own error."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("input_features_mask must be a tensor of shape (clips, frames), got "
                         f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    mask = mask.to("cpu")
    chunk_len = n_window * 2
    clips, frames = mask.shape
    if frames % chunk_len:
        return None
    module = importlib.import_module(module_name)
    post_cnn = getattr(module, encoder)._post_cnn_length
    # The encoder's own lines, on the host copy.
    feature_lens = mask.sum(-1).to(torch.long)
    chunk_lengths = mask.view(clips, frames // chunk_len, chunk_len).sum(dim=-1).reshape(-1).to(torch.long)
    cu_seqlens = module.get_audio_cu_seqlens(chunk_lengths, feature_lens, n_window_infer, n_window)
    # (the chunks' time steps after the three stride-2 convolutions: a chunk of chunk_len frames, as the conv outputs)
    time_steps = int(post_cnn(torch.tensor([chunk_len]))[0])
    valid_mask = torch.arange(time_steps) < post_cnn(chunk_lengths).unsqueeze(1)
    valid_indices = valid_mask.flatten().nonzero().squeeze(-1)
    seqlens = tuple((cu_seqlens[1:] - cu_seqlens[:-1]).tolist())  # host tensors: no device involved
    return MaskedAudioPlan(feature_lens=feature_lens, mask_shape=(clips, frames), seqlens=seqlens,
                           max_seqlen=SegmentedMax(max(seqlens, default=0), seqlens), cu_seqlens=cu_seqlens,
                           valid_shape=tuple(valid_mask.shape), valid_indices=valid_indices,
                           n_outputs=int(valid_indices.numel()), host_seqlens=torch.tensor(seqlens, dtype=torch.int64))


def encoder_windows(config) -> dict:
    """The audio config's window values the encoder's plan is made with (``PlanHooks.values``)."""
    return {"n_window": config.audio_config.n_window, "n_window_infer": config.audio_config.n_window_infer}


def encoder_plan(spec, host: dict) -> dict:
    """The Plan's ``audio`` field: the encoder's windows and valid frames from the host mask (``PlanHooks.fields``)."""
    mask = host["input_features_mask"]
    if mask is None:
        return {}
    return {"audio": masked_audio_plan(mask, spec.vision_module, _ENCODER, spec.value("n_window"),
                                       spec.value("n_window_infer"))}


# ``input_features_mask``: each clip's real mel frames, one row per clip (one clip per batch row).
PLAN = PlanHooks(inputs=("input_features_mask",), per_row=("input_features_mask",), fields=encoder_plan,
                 values=encoder_windows)
