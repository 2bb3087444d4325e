"""The Omni thinkers: Qwen3-Omni-MoE and Qwen2.5-Omni (the thinker: audio encoder, vision tower, text model).

What syncfree patches in each (``FAMILIES``), how their processors lay a batch out, audio included
(``inputs``), and their presets (``presets``). The vision tower is Qwen3-VL's (learned positions,
deepstack) or Qwen2.5-VL's (windows); the rope index is computed on the host by the plan, in NumPy for batches
without audio (``rope``), else by stock's own index run there.
"""

from __future__ import annotations

import dataclasses

from ...plan.hooks import PlanHooks
from ...plan.spec import AudioLayout, Layout, PositionTable, RotaryIndex, TowerShape
from ...rewrite.edits import (
    AUDIO_ATTENTION,
    AUDIO_SCATTER,
    DEEPSTACK_MERGE,
    DEEPSTACK_PROCESS,
    FEATURE_SCATTER,
    PLACEHOLDER_MASK,
    ROPE_DELTAS_AFTER_CACHE,
    VISION_ATTENTION,
    feature_split,
)
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_generate, make_model_forward, make_vision_forward
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import PACKS, VISION_NEEDS, WINDOW_NEEDS, family_module
from . import audio_features
from .audio_features import AUDIO_FEATURES
from .inputs import OMNI_ITEMS, build_omni_inputs, is_omni, omni_forward_kwargs
from .presets import OMNI_PRESETS, THINKER_CLASSES, thinker_class
from .rope import qwen2_5_omni_rope_index, qwen3_omni_rope_index
from .wrappers import make_audio_forward, make_omni_rope_index

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "MODEL_CLASSES", "GROUP", "ITEMS"]

_MODEL_PARAMS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "pixel_values_videos",
                 "image_grid_thw", "video_grid_thw", "input_features", "feature_attention_mask",
                 "use_audio_in_video", "video_second_per_grid")
_ROPE_PARAMS = ("input_ids", "image_grid_thw", "video_grid_thw", "attention_mask", "use_audio_in_video",
                "audio_seqlens", "second_per_grids")


# The audio clips' frames (``feature_attention_mask``) and a video's seconds per temporal patch, by the Omni processors'
# names. (generate() repeats every tensor row by row: the plan's own expansion for an Omni thinker.)
PLAN = PlanHooks(inputs=("feature_attention_mask", "video_second_per_grid"))


_SPLIT = {kind: feature_split("self.visual.spatial_merge_size", kinds=(kind,)) for kind in ("image", "video")}


def _omni_thinker(prefix: str, folder: str, vision: str, audio: str, deepstack: bool, rope_index) -> Family:
    """An Omni thinker: a Qwen-VL vision tower, an audio encoder, and a text model (``*Thinker*`` classes).
    Qwen3-Omni's tower is Qwen3-VL's (learned positions, deepstack); Qwen2.5-Omni's is Qwen2.5-VL's (windows)."""
    vision_needs = (("get_vision_interpolation_indices_and_weights(",) if deepstack
                    else WINDOW_NEEDS)
    # Transformers < 5.2x has no *ThinkerModel: its *ThinkerForConditionalGeneration holds the towers itself.
    thinker = dict(fallback_cls=f"{prefix}ThinkerForConditionalGeneration")
    targets = (
        Target(f"{prefix}VisionAttention", "forward", edits=VISION_ATTENTION),
        Target(vision, "forward", wrap=make_vision_forward, params=("hidden_states", "grid_thw"),
               needs=VISION_NEEDS + vision_needs),
        Target(f"{prefix}AudioAttention", "forward", edits=AUDIO_ATTENTION),
        Target(audio, "forward", wrap=make_audio_forward, params=("input_features", "feature_lens"),
               needs=("chunk_and_pad_features(", "get_valid_indices(", "get_audio_cu_seqlens(", "kwargs=kwargs")),
        Target(f"{prefix}ThinkerModel", "get_audio_features", edits=AUDIO_FEATURES, **thinker),
        Target(f"{prefix}ThinkerModel", "get_placeholder_mask", edits=PLACEHOLDER_MASK, **thinker),
        # (the cache's length before the rope deltas a first call leaves on the model: a compiled model's next batch
        # of the same inputs compiles no graph for them)
        Target(f"{prefix}ThinkerModel", "compute_3d_position_ids", edits=ROPE_DELTAS_AFTER_CACHE, optional=True,
               **thinker),
        # (for a traced forward: the features' split by the plan's per-item counts, a graph cannot read the grid)
        *(Target(f"{prefix}ThinkerModel", f"get_{kind}_features", edits=_SPLIT[kind], **thinker)
          for kind in ("image", "video")),
        Target(f"{prefix}ThinkerModel", "forward",
               edits=FEATURE_SCATTER + AUDIO_SCATTER + (DEEPSTACK_MERGE if deepstack else ()),
               wrap=make_model_forward, params=_MODEL_PARAMS,
               needs=("self.get_placeholder_mask(", "self.compute_3d_position_ids(", "self.get_audio_features("),
               **thinker),
        Target(f"{prefix}PreTrainedModelForConditionalGeneration", "get_rope_index", wrap=make_omni_rope_index,
               params=_ROPE_PARAMS, needs=("input_ids.tolist()", "audio_seqlens[audio_idx]")),
        Target(f"{prefix}ThinkerForConditionalGeneration", "generate", wrap=make_generate, inherited=True),
    )
    if deepstack:
        targets += (Target(f"{prefix}ThinkerTextModel", "_deepstack_process", edits=DEEPSTACK_PROCESS),)
    layout = Layout(family_module(folder), table=PositionTable() if deepstack else None,
                    tower=TowerShape(windows=not deepstack), audio=AudioLayout(encoder=True),
                    rope=RotaryIndex(audio_class=f"{prefix}PreTrainedModelForConditionalGeneration"),
                    plan=dataclasses.replace(PLAN, rope_index=rope_index), one_graph=True, stream=True,
                    **PACKS)
    return Family(f"{folder}_thinker", targets, layout, helpers=audio_features)


FAMILIES: tuple[Family, ...] = (
    _omni_thinker("Qwen3OmniMoe", "qwen3_omni_moe", "Qwen3OmniMoeVisionEncoder", "Qwen3OmniMoeAudioEncoder",
                  deepstack=True, rope_index=qwen3_omni_rope_index),
    _omni_thinker("Qwen2_5Omni", "qwen2_5_omni", "Qwen2_5OmniVisionEncoder", "Qwen2_5OmniAudioEncoder",
                  deepstack=False, rope_index=qwen2_5_omni_rope_index),
)
PRESETS = {name: Preset(name, values, pad, about) for name, (values, pad, about) in OMNI_PRESETS.items()}
# model_type -> the vision tower's class (``build_vision_model`` builds it alone).
VISION_CLASSES = {"qwen3_omni_moe_thinker": "Qwen3OmniMoeVisionEncoder",
                  "qwen2_5_omni_thinker": "Qwen2_5OmniVisionEncoder"}
# model_type -> how to get the class a preset builds (no auto class builds a thinker from its config).
MODEL_CLASSES = {model_type: thinker_class for model_type in THINKER_CLASSES}


ITEMS = OMNI_ITEMS  # the items its processor takes


def processor_batch(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                    pad_token_id: int | None = None) -> dict:
    """The processor-style CPU batch for ``samples``, audio too, with the forward's ``use_audio_in_video`` flag
    beside the tensors."""
    return {**build_omni_inputs(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id or 0),
            **omni_forward_kwargs(samples)}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, processor_batch, presets=PRESETS, vision_classes=VISION_CLASSES,
                    model_classes=MODEL_CLASSES, items=ITEMS, claims=is_omni,
                    display={"qwen3_omni_moe": "Qwen3-Omni-MoE (thinker)", "qwen2_5_omni": "Qwen2.5-Omni (thinker)"})
