"""Qwen3-ASR's audio encoder wrapper: it takes the processor's ``input_features_mask``.

``make_masked_audio_forward`` hands the stock forward the plan's windows and valid frames (``plan``): stock pops the
windows from its kwargs, the rewritten select (``valid_frames``) the valid frames. Without a plan, one read of the
mask, then the same plan made on the host.
"""

from __future__ import annotations

import functools

import torch

from ...plan import active
from ...plan.tensors import same_host_values
from ...rewrite.call_args import same_device
from ...rewrite.host_read import read_to_host_syncs_once
from ...rewrite.roles import wrapper
from ...rewrite.segment_op import with_traced_windows
from .plan import MaskedAudioPlan, masked_audio_plan

__all__ = ["make_masked_audio_forward"]


def _masked_audio_plan_for(input_features_mask):
    """The active plan's audio plan when ``input_features_mask`` is the mask it was made from (that very tensor, given
    to the forward, or a host tensor of its values)."""
    entry = active.current()
    audio = entry.plan.audio if entry is not None else None
    if not isinstance(audio, MaskedAudioPlan) or not isinstance(input_features_mask, torch.Tensor):
        return None
    if entry.given.get("input_features_mask") is input_features_mask:
        return audio
    if torch.compiler.is_compiling():  # (traced: the forward's own mask only; a graph cannot compare values)
        return None
    return audio if same_host_values(input_features_mask, entry.plan.host.get("input_features_mask")) else None


@wrapper("hands the stock audio encoder the plan's windows and valid frames (from the host copy of "
         'input_features_mask)')
def make_masked_audio_forward(stock):
    @functools.wraps(stock)
    def forward(self, input_features=None, input_features_mask=None, **kwargs):
        audio = kwargs.pop("syncfree_audio_plan", None)  # a plan handed in (a compiled encoder's callers, tests)
        if (input_features is None or not isinstance(input_features_mask, torch.Tensor) or "cu_seqlens" in kwargs
                or "max_seqlen" in kwargs):
            return stock(self, input_features, input_features_mask, **kwargs)
        audio = audio or _masked_audio_plan_for(input_features_mask)
        if torch.compiler.is_compiling():
            # Traced: the plan of the traced forward (found by the very mask it was given), else stock's code. Its
            # windows as a host tensor where the attention splits by them (not flash: that reads max_seqlen as an int).
            if audio is None:
                return stock(self, input_features, input_features_mask, **kwargs)
            windows = with_traced_windows(audio.encoder_kwargs(), self.layers[0].self_attn, audio.cu_seqlens,
                                          audio.host_seqlens, audio.seqlens)
            return stock(self, input_features, input_features_mask, **windows, **kwargs)
        if audio is None:  # no plan: one read of the mask (none if it is on the host already)
            host = read_to_host_syncs_once({"mask": input_features_mask})["mask"]
            audio = masked_audio_plan(host, type(self).__module__, type(self).__name__, self.n_window,
                                      self.n_window_infer)
            if audio is None:  # a batch stock refuses: its own error
                return stock(self, input_features, input_features_mask, **kwargs)
        if not same_device(audio.device, input_features.device):
            audio = audio.to(input_features.device)
        return stock(self, input_features, input_features_mask, **audio.encoder_kwargs(), **kwargs)

    return forward
