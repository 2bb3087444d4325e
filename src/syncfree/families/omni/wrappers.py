"""The Omni thinkers' wrappers (Qwen3-Omni-MoE, Qwen2.5-Omni): the audio encoder and the rope index.

* ``make_audio_forward``: the audio encoder. Hands the stock forward the plan's chunking, valid
  frames and attention windows (stock pops them from its kwargs); the window sizes ride along in
  ``max_seqlen`` (``syncfree.plan.audio.SegmentedMax``) to the split in every encoder layer, so the device is
  never asked for them.
* ``make_omni_rope_index``: the 3D rotary index, from the plan (made by stock's own index on the
  host); without a plan, one read of the control tensors, then stock's index on the host.
"""

from __future__ import annotations

import functools

import torch

from ...plan import active
from ...plan.audio import audio_plan_from_lengths
from ...plan.tensors import same_host_values
from ...rewrite.call_args import fits, same_device
from ...rewrite.host_read import read_to_host_syncs_once
from ...rewrite.roles import wrapper
from ...rewrite.segment_op import with_traced_windows
from ...rewrite.wrappers import planned_positions, rope_index_wrapper, stock_index_on_host

__all__ = ["make_audio_forward", "make_omni_rope_index"]


def _audio_plan_for(feature_lens):
    """The active plan's audio plan when ``feature_lens`` is its host lengths tensor (or equal host values; in a
    traced forward that very tensor, which ``audio_features.audio_lengths`` handed on)."""
    entry = active.current()
    audio = entry.plan.audio if entry is not None else None
    if audio is None or not isinstance(feature_lens, torch.Tensor):
        return None
    if torch.compiler.is_compiling():
        return audio if feature_lens is audio.feature_lens else None
    return audio if same_host_values(feature_lens, audio.feature_lens) else None


@wrapper("hands the stock audio encoder the plan's window sizes")
def make_audio_forward(stock):
    @functools.wraps(stock)
    def forward(self, input_features=None, feature_lens=None, **kwargs):
        audio = kwargs.pop("syncfree_audio_plan", None)  # a plan handed in (compile_audio-style callers, tests)
        if input_features is None or feature_lens is None or "padded_feature" in kwargs or "cu_seqlens" in kwargs:
            return stock(self, input_features, feature_lens, **kwargs)
        audio = audio or _audio_plan_for(feature_lens)
        if torch.compiler.is_compiling():
            # Traced: the traced forward's plan, else stock's code. Its windows as a host tensor where the attention
            # splits by them (not flash: that reads max_seqlen as an int).
            if audio is None:
                return stock(self, input_features, feature_lens, **kwargs)
            # (the padded chunks gathered, no split by ints)
            extra = with_traced_windows(audio.traced_encoder_kwargs(input_features), self.layers[0].self_attn,
                                        audio.cu_seqlens, audio.host_seqlens, audio.seqlens)
            return stock(self, input_features, feature_lens, **extra, **kwargs)
        if audio is None:  # no plan: one read of the lengths (none if they are on the host already)
            host = read_to_host_syncs_once({"feature_lens": feature_lens})["feature_lens"]
            audio = audio_plan_from_lengths(host, type(self).__module__, self.n_window,
                                            getattr(self.config, "n_window_infer", 0))
        if not same_device(audio.device, input_features.device):
            audio = audio.to(input_features.device)
        # The chunking, valid frames and windows, planned; the layers' splits find their sizes in max_seqlen.
        extra = audio.encoder_kwargs(input_features)
        return stock(self, input_features, feature_lens, **extra, **kwargs)

    return forward


def _fits_generation(entry, input_ids) -> bool:
    """generate()'s copy of the prompt (maybe repeated for beams), on the plan's device."""
    return (entry.in_generate and isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2
            and fits(entry.plan, tuple(input_ids.shape)) and same_device(entry.plan.device, input_ids.device))


def _registered_plan(given: dict):
    """The plan prepare() registered for these input_ids, when the call's other inputs are the ones it describes."""
    registration = active.registered(given.get("input_ids"))
    if registration is None or registration.plan.spec.rope.audio_class is None:
        return None
    plan = registration.plan
    try:
        active.check_unchanged(registration, {n: given.get(n) for n in ("input_ids", "attention_mask")})
    except active.StalePlan:
        return None
    if given.get("attention_mask") is None:
        return None
    for name, kept in (("image_grid_thw", plan.host["image_grid_thw"]), ("video_grid_thw", plan.host["video_grid_thw"]),
                       ("second_per_grids", plan.host["video_second_per_grid"]),
                       ("audio_seqlens", plan.audio.feature_lens if plan.audio is not None else None)):
        if not same_host_values(given.get(name), kept):
            return None
    return plan


@wrapper("the plan's 3D positions (stock's index, run on the host copies)")
def make_omni_rope_index(stock):
    def answer(self, given, call_stock):
        input_ids, mask = given.get("input_ids"), given.get("attention_mask")
        flag = given.get("use_audio_in_video", False)
        entry = active.current()
        if torch.compiler.is_compiling():
            # Traced: the traced forward's positions, as graph inputs (the index in the graph would be sized by the
            # grids' values), where the plan holds them for this flag; stock's index otherwise.
            planned = planned_positions(entry, input_ids, mask)
            if planned is not None and bool(flag) == entry.plan.use_audio_in_video:
                return planned
            return call_stock()
        if entry is not None and entry.plan.spec.rope.audio_class is not None:
            plan = None
            if entry.owns(input_ids) and mask is entry.attention_mask:
                plan = entry.plan
            elif _fits_generation(entry, input_ids):  # generate()'s copy of the prompt (maybe repeated)
                plan = entry.plan.expanded(input_ids.shape[0])
            found = plan.positions_for_audio_in_video(flag) if plan is not None else None
            if found is not None:
                return found
        elif entry is None:
            plan = _registered_plan(given)
            found = plan.positions_for_audio_in_video(flag) if plan is not None else None
            if found is not None:
                return found
        # No plan: one read of the control tensors, stock's index on the host, the result sent back.
        return stock_index_on_host(stock, self, given)

    return rope_index_wrapper(stock, answer)
