"""What syncfree patches in each model family: a table, by ``config.model_type``.

A target is one stock function: the lines rewritten in it (``edits``, see ``edits.py``) and/or the
wrapper put around it (``wrap``, see ``wrappers.py``), with what the wrapper relies on in the stock
code (``params`` it must take, ``needs``: code it must contain). Families differ only in class
names and in which of the shared pieces they have (Qwen3-VL's deepstack; Qwen2.5-VL's windows).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..rewrite import Edit
from .edits import (AUDIO_ATTENTION, AUDIO_FEATURES, AUDIO_SCATTER, DEEPSTACK_MERGE, PACKED_CHECK, DEEPSTACK_PROCESS, FEATURE_SCATTER, GENERATION_POSITIONS, PLACEHOLDER_MASK, RECURRENT_MASK,
                    VISION_ATTENTION)

__all__ = ["Target", "Family", "FAMILIES", "MODULE_TARGETS"]


@dataclass(frozen=True)
class Target:
    cls: str  # class name in the family's modeling module (or, for MODULE_TARGETS, a function name)
    attr: str
    edits: tuple[Edit, ...] = ()
    wrap: str | None = None  # the make_* in wrappers.py
    params: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    inherited: bool = False  # the stock function may come from a base class (GenerationMixin.generate)
    optional: bool = False  # skipped where the stock function or the edited code is absent (older releases)
    fallback_cls: str | None = None  # the class holding the function in releases without ``cls``


@dataclass(frozen=True)
class Family:
    model_type: str
    modeling: str
    targets: tuple[Target, ...]
    # How the family lays out its inputs (what the plan and the rope index need to know):
    learned_positions: bool = False  # a learned position table, resampled to each grid (Qwen3-VL's vision tower)
    frames_as_runs: bool = False  # each video frame is its own placeholder run, timestamps between (Qwen3-VL)
    windows: bool = False  # window attention in the vision tower (Qwen2.5-VL)
    video_time_scale: bool = False  # video positions step by tokens_per_second * seconds (Qwen2.5-VL)
    # Omni thinkers: an audio encoder, and a rope index the plan runs as stock on the host (defined on this class).
    audio: bool = False
    rope_class: str | None = None


_MODEL_PARAMS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "pixel_values_videos",
                 "image_grid_thw", "video_grid_thw", "mm_token_type_ids")
_MODEL_NEEDS = ("self.get_placeholder_mask(", "masked_scatter(", "self.compute_3d_position_ids(",
                "self.language_model(")
_ROPE_PARAMS = ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw", "attention_mask")
_ROPE_NEEDS = ("max(grid_thw[1], grid_thw[2]) // spatial_merge_size", "llm_positions.max() + 1 - len(current_input_ids)",
               "mm_token_type_ids[batch_idx]")
_VISION_NEEDS = ("get_vision_position_ids(grid_thw", "get_vision_attention_seqlens(grid_thw", "kwargs=kwargs",
                 "**kwargs,")


def _common(attention: str, vision: str, prefix: str, vision_needs: tuple, rope_needs: tuple,
            model_edits: tuple = ()) -> tuple[Target, ...]:
    return (
        Target(attention, "forward", edits=VISION_ATTENTION),
        Target(vision, "forward", wrap="make_vision_forward", params=("hidden_states", "grid_thw"),
               needs=_VISION_NEEDS + vision_needs),
        Target(f"{prefix}Model", "get_placeholder_mask", edits=PLACEHOLDER_MASK),
        Target(f"{prefix}Model", "forward", edits=FEATURE_SCATTER + model_edits, wrap="make_model_forward",
               params=_MODEL_PARAMS,
               needs=_MODEL_NEEDS),
        Target(f"{prefix}Model", "get_rope_index", wrap="make_get_rope_index", params=_ROPE_PARAMS,
               needs=_ROPE_NEEDS + rope_needs),
        Target(f"{prefix}ForConditionalGeneration", "generate", wrap="make_generate", inherited=True),
        Target(f"{prefix}ForConditionalGeneration", "_prepare_position_ids_for_generation",
               edits=GENERATION_POSITIONS, optional=True),
    )


def _qwen3_vl(prefix: str, deepstack: bool = True) -> tuple[Target, ...]:
    """Qwen3-VL's vision tower and layout; Qwen3.5 has the same without the deepstack features."""
    targets = _common(f"{prefix}VisionAttention", f"{prefix}VisionModel", prefix,
                      vision_needs=("get_vision_interpolation_indices_and_weights(",),
                      rope_needs=("video_grid_thw[:, 0] = 1",), model_edits=DEEPSTACK_MERGE if deepstack else ())
    if deepstack:
        targets += (Target(f"{prefix}TextModel", "_deepstack_process", edits=DEEPSTACK_PROCESS),)
    return targets


def _family(model_type: str, targets: tuple[Target, ...], **traits) -> Family:
    return Family(model_type, f"transformers.models.{model_type}.modeling_{model_type}", targets, **traits)


_OMNI_MODEL_PARAMS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "pixel_values_videos",
                      "image_grid_thw", "video_grid_thw", "input_features", "feature_attention_mask",
                      "use_audio_in_video", "video_second_per_grid")
_OMNI_ROPE_PARAMS = ("input_ids", "image_grid_thw", "video_grid_thw", "attention_mask", "use_audio_in_video",
                     "audio_seqlens", "second_per_grids")


def _omni_thinker(prefix: str, modeling: str, vision: str, audio: str, deepstack: bool) -> Family:
    """An Omni thinker: a Qwen-VL vision tower, an audio encoder, and a text model (``*Thinker*`` classes).
    Qwen3-Omni's tower is Qwen3-VL's (learned positions, deepstack); Qwen2.5-Omni's is Qwen2.5-VL's (windows)."""
    vision_needs = (("get_vision_interpolation_indices_and_weights(",) if deepstack
                    else ("get_vision_window_index(", 'kwarg_name="max_window_seqlen"'))
    # Transformers < 5.2x has no *ThinkerModel: its *ThinkerForConditionalGeneration holds the towers itself.
    thinker = dict(fallback_cls=f"{prefix}ThinkerForConditionalGeneration")
    targets = (
        Target(f"{prefix}VisionAttention", "forward", edits=VISION_ATTENTION),
        Target(vision, "forward", wrap="make_vision_forward", params=("hidden_states", "grid_thw"),
               needs=_VISION_NEEDS + vision_needs),
        Target(f"{prefix}AudioAttention", "forward", edits=AUDIO_ATTENTION),
        Target(audio, "forward", wrap="make_audio_forward", params=("input_features", "feature_lens"),
               needs=("chunk_and_pad_features(", "get_valid_indices(", "get_audio_cu_seqlens(", "kwargs=kwargs")),
        Target(f"{prefix}ThinkerModel", "get_audio_features", edits=AUDIO_FEATURES, **thinker),
        Target(f"{prefix}ThinkerModel", "get_placeholder_mask", edits=PLACEHOLDER_MASK, **thinker),
        Target(f"{prefix}ThinkerModel", "forward", edits=FEATURE_SCATTER + AUDIO_SCATTER + (DEEPSTACK_MERGE if deepstack else ()),
               wrap="make_model_forward", params=_OMNI_MODEL_PARAMS,
               needs=("self.get_placeholder_mask(", "self.compute_3d_position_ids(", "self.get_audio_features("),
               **thinker),
        Target(f"{prefix}PreTrainedModelForConditionalGeneration", "get_rope_index", wrap="make_omni_rope_index",
               params=_OMNI_ROPE_PARAMS, needs=("input_ids.tolist()", "audio_seqlens[audio_idx]")),
        Target(f"{prefix}ThinkerForConditionalGeneration", "generate", wrap="make_generate", inherited=True),
    )
    if deepstack:
        targets += (Target(f"{prefix}ThinkerTextModel", "_deepstack_process", edits=DEEPSTACK_PROCESS),)
    return Family(f"{modeling}_thinker", f"transformers.models.{modeling}.modeling_{modeling}", targets,
                  learned_positions=deepstack, windows=not deepstack, audio=True, rope_class=f"{prefix}PreTrainedModelForConditionalGeneration")


_QWEN3_LAYOUT = dict(learned_positions=True, frames_as_runs=True)

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    _family("qwen3_vl", _qwen3_vl("Qwen3VL"), **_QWEN3_LAYOUT),
    _family("qwen3_vl_moe", _qwen3_vl("Qwen3VLMoe"), **_QWEN3_LAYOUT),
    _family("qwen3_5", _qwen3_vl("Qwen3_5", deepstack=False), **_QWEN3_LAYOUT),
    _family("qwen3_5_moe", _qwen3_vl("Qwen3_5Moe", deepstack=False), **_QWEN3_LAYOUT),
    _family("qwen2_vl", _common("VisionAttention", "Qwen2VisionTransformerPretrainedModel", "Qwen2VL",
                                vision_needs=(), rope_needs=())),
    _family("qwen2_5_vl", _common("Qwen2_5_VLVisionAttention", "Qwen2_5_VisionTransformerPretrainedModel", "Qwen2_5_VL",
                                  vision_needs=("get_vision_window_index(", 'kwarg_name="max_window_seqlen"'),
                                  rope_needs=("tokens_per_second * ",)),
            windows=True, video_time_scale=True),
    _omni_thinker("Qwen3OmniMoe", "qwen3_omni_moe", "Qwen3OmniMoeVisionEncoder", "Qwen3OmniMoeAudioEncoder", deepstack=True),
    _omni_thinker("Qwen2_5Omni", "qwen2_5_omni", "Qwen2_5OmniVisionEncoder", "Qwen2_5OmniAudioEncoder", deepstack=False),
)}

# Module-level functions shared by every family: (module, function) -> target. Modules that imported
# the function by name (``from ...masking_utils import create_recurrent_attention_mask``) get it too.
MODULE_TARGETS: dict[tuple[str, str], Target] = {
    ("transformers.masking_utils", "_ignore_causal_mask_sdpa"): Target(
        "_ignore_causal_mask_sdpa", "", wrap="make_ignore_causal_mask_sdpa", params=("padding_mask",),
        needs=("fast_all(padding_mask", "is_tracing(")),
    ("transformers.masking_utils", "create_recurrent_attention_mask"): Target(
        "create_recurrent_attention_mask", "", edits=RECURRENT_MASK, optional=True),
    ("transformers.masking_utils", "find_packed_sequence_indices"): Target(
        "find_packed_sequence_indices", "", edits=PACKED_CHECK, optional=True),
}
