"""EXAONE-4.5: Qwen2.5-VL's windowed vision tower before EXAONE-4.0's text model, without 3D positions.

The tower (``Exaone4_5_VisionModel``) is Qwen2.5-VL's code with grouped-query attention; the multimodal
forward is Qwen2.5-VL's minus the rotary index: the text model numbers tokens 0..S-1 itself, so the plan
computes no positions and the forward takes no ``mm_token_type_ids``. The processor writes only the
placeholders (the chat template writes the markers around them, with ids the config does not name).
"""

from __future__ import annotations

from ...plan.spec import Layout, RotaryIndex, TowerShape
from ...rewrite.targets import Family
from ..group import FamilyGroup
from ..preset import Preset
from ..qwen_vl.inputs import build_inputs
from ..shared import WINDOW_NEEDS, family_module, vlm_targets

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP"]

FAMILIES: tuple[Family, ...] = (
    Family("exaone4_5", vlm_targets("Exaone4_5_VisionAttention", "Exaone4_5_VisionModel", "Exaone4_5_Model",
                                    "Exaone4_5_ForConditionalGeneration", vision_needs=WINDOW_NEEDS, rope_needs=None),
           Layout(family_module("exaone4_5"), tower=TowerShape(windows=True), rope=RotaryIndex(mrope=False),
                  vision_markers=False, token_types=False, one_graph=True, stream=True)),
)

# A tiny model with the real layout rules: patch 14, merge 2, 112-pixel windows (so test images larger than
# 4x4 merged patches get several), full attention in blocks 1 and 3, grouped-query vision attention (4 query
# heads, 2 key/value heads, as the published 16/8), and a text model of 3 sliding-window layers and 1 full.
_EXAONE45_TINY = dict(
    model_type="exaone4_5", tie_word_embeddings=False, image_token_id=67, video_token_id=68,
    vision_config=dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=4, num_key_value_heads=2,
                       out_hidden_size=64, hidden_act="silu", in_channels=3, patch_size=14, spatial_merge_size=2,
                       temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1, 3]),
    text_config=dict(model_type="exaone4", vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                     max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=16, sliding_window_pattern=4,
                     bos_token_id=None, eos_token_id=None),
)

# LGAI-EXAONE/EXAONE-4.5-33B: the values of a full-size config of the (beta) checkpoint, which its GGUF metadata
# confirms for the tower (28 blocks of 2048, 32 query and 8 key/value heads, full attention every 7th block).
_EXAONE45_33B = dict(
    model_type="exaone4_5", tie_word_embeddings=False, image_token_id=67, video_token_id=68,
    vision_config=dict(depth=28, hidden_size=2048, num_heads=32, num_key_value_heads=8, intermediate_size=5120,
                       hidden_act="silu", patch_size=14, in_channels=3, spatial_merge_size=2, temporal_patch_size=2,
                       window_size=112, fullatt_block_indexes=[6, 13, 20, 27], out_hidden_size=5120),
    text_config=dict(model_type="exaone4", vocab_size=153600, hidden_size=5120, intermediate_size=27392,
                     num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                     hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=131072, sliding_window=4096,
                     sliding_window_pattern=4,
                     rope_parameters=dict(rope_type="llama3", rope_theta=1000000.0, factor=16.0,
                                          high_freq_factor=4.0, low_freq_factor=1.0,
                                          original_max_position_embeddings=8192),
                     bos_token_id=1, eos_token_id=53),
)

PRESETS: dict[str, Preset] = {
    "exaone4.5-33b": Preset("exaone4.5-33b", _EXAONE45_33B, 0, "EXAONE-4.5-33B (published shapes)"),
    "exaone4.5-tiny": Preset("exaone4.5-tiny", _EXAONE45_TINY, 0, "tiny EXAONE-4.5 for tests (window attention, GQA)"),
}
VISION_CLASSES = {"exaone4_5": "Exaone4_5_VisionModel"}


# The group, as the registry reads it (``families.GROUPS``).
# Its batches: Placeholders only, no ``mm_token_type_ids`` (as ``Exaone4_5_Processor`` returns them).
GROUP = FamilyGroup(FAMILIES, build_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"exaone4_5": "EXAONE-4.5"})
