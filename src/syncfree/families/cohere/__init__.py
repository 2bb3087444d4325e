"""Cohere Compass (North Vision): Qwen3-VL's code under a text model with per-layer-type rope and sliding windows.

Its tower, vision attention, rotary index, multimodal forward and deepstack merge are Qwen3-VL's, statement for
statement, so every Qwen3-VL target applies as it is (``qwen3_vl_targets``; each edit still matches the family's
own copy of the code, and a release that changes one copy refuses that function). Its text model keeps the
deepstack features and takes 4-row positions (the text row first); its sliding-window layers fill a generation cache
whose window tensor syncfree makes without a blocking copy (``MODULE_TARGETS``). The processor lays a batch out as
Qwen3-VL's does: one run per video frame between the config's vision start/end ids, timestamps between frames.
"""

from __future__ import annotations

from ...plan.spec import Layout
from ...rewrite.targets import Family
from ..group import FamilyGroup
from ..preset import Preset
from ..qwen_vl import QWEN3_LAYOUT, qwen3_vl_targets
from ..qwen_vl.inputs import build_inputs
from ..shared import PACKS, family_module, scale_sections

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP"]

FAMILIES: tuple[Family, ...] = (
    Family("cohere_compass", qwen3_vl_targets("CohereCompass"), Layout(family_module("cohere_compass"), **QWEN3_LAYOUT,
                                                                                       one_graph=True, stream=True, **PACKS)),
)

# A tiny model with the real layout rules: patch 16, temporal patch 2, merge 2, an 8x8 learned table, three
# deepstack levels, interleaved M-RoPE in both layer kinds, three sliding-window layers and one full one (as the
# default pattern of four).
_ROPE = dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])
_COHERE_TINY = dict(
    model_type="cohere_compass", image_token_id=1000, video_token_id=1001, vision_start_token_id=1002,
    vision_end_token_id=1003,
    vision_config=dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
                       spatial_merge_size=2, num_position_embeddings=64, deepstack_visual_indexes=[1, 2, 3]),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, sliding_window=8,
                     layer_types=["sliding_attention"] * 3 + ["full_attention"],
                     rope_parameters={"sliding_attention": dict(_ROPE), "full_attention": dict(_ROPE)},
                     pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
PRESETS: dict[str, Preset] = {
    "cohere-compass-tiny": Preset("cohere-compass-tiny", _COHERE_TINY, 0,
                                  "tiny Cohere Compass for tests (sliding-window text layers, deepstack)"),
}
VISION_CLASSES = {"cohere_compass": "CohereCompassVisionModel"}


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_cohere_compass(config) -> None:
    # Rope parameters are per layer type and the default names none: the rotary embedding then has no entry for
    # "full_attention". Give every kind the family's default rope (its M-RoPE sections, scaled to the head).
    text = config.text_config
    half = text.hidden_size // text.num_attention_heads // 2
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": scale_sections([24, 20, 20], half)}
    text.rope_parameters = {kind: dict(rope) for kind in dict.fromkeys(text.layer_types)}


CENSUS_FIXES = {"cohere_compass": _census_fix_cohere_compass}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_inputs, presets=PRESETS, vision_classes=VISION_CLASSES, census_fixes=CENSUS_FIXES,
                    display={"cohere_compass": "Cohere Compass"})
