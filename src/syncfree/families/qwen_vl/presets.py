"""Qwen-VL presets: the published shapes written out as config values, and tiny ones for tests.

Nothing is downloaded: presets build random-weight models from these values (``syncfree.families.loading``).
"""

from __future__ import annotations

import copy

from ..preset import Preset

__all__ = ["PRESETS", "VISION_CLASSES"]

# Token ids shared by every published Qwen3-VL checkpoint.
_QWEN_TOKENS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                    vision_end_token_id=151653)
_ROPE = dict(rope_type="default", rope_theta=5_000_000, mrope_section=[24, 20, 20], mrope_interleaved=True)

# Qwen/Qwen3-VL-2B-Instruct config.json (values as published).
_QWEN3_VL_2B = dict(
    model_type="qwen3_vl",
    tie_word_embeddings=True,
    **_QWEN_TOKENS,
    vision_config=dict(
        depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
        hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
        spatial_merge_size=2, num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
    ),
    text_config=dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
        max_position_embeddings=262144, rms_norm_eps=1e-6, rope_parameters=dict(_ROPE),
        tie_word_embeddings=True,
    ),
)

# Qwen/Qwen3-VL-8B-Instruct config.json (values as published).
_QWEN3_VL_8B = dict(
    model_type="qwen3_vl",
    tie_word_embeddings=False,
    **_QWEN_TOKENS,
    vision_config=dict(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
        hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
        spatial_merge_size=2, num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
    ),
    text_config=dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
        max_position_embeddings=262144, rms_norm_eps=1e-6, rope_parameters=dict(_ROPE),
        tie_word_embeddings=False,
    ),
)

# A tiny model with the real layout rules (patch 16, temporal patch 2, merge 2, three
# deepstack levels, interleaved M-RoPE) and small widths, for tests.
_QWEN3_VL_TINY = dict(
    model_type="qwen3_vl",
    tie_word_embeddings=False,
    image_token_id=1000, video_token_id=1001, vision_start_token_id=1002, vision_end_token_id=1003,
    vision_config=dict(
        depth=4, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
        hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
        spatial_merge_size=2, num_position_embeddings=64, deepstack_visual_indexes=[1, 2, 3],
    ),
    text_config=dict(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
        max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_parameters=dict(rope_type="default", rope_theta=5_000_000, mrope_section=[2, 3, 3],
                             mrope_interleaved=True),
    ),
)


# Qwen3-VL-MoE: the tiny model with a sparse-MoE text model (every layer sparse).
_QWEN3_VL_MOE_TINY = copy.deepcopy(_QWEN3_VL_TINY)
_QWEN3_VL_MOE_TINY["model_type"] = "qwen3_vl_moe"
_QWEN3_VL_MOE_TINY["text_config"].update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         decoder_sparse_step=1, mlp_only_layers=[])

# Qwen/Qwen3-VL-30B-A3B-Instruct config.json (values as published).
_QWEN3_VL_30B_A3B = dict(
    model_type="qwen3_vl_moe",
    tie_word_embeddings=False,
    **_QWEN_TOKENS,
    vision_config=dict(_QWEN3_VL_8B["vision_config"], out_hidden_size=2048),
    text_config=dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, hidden_act="silu",
        max_position_embeddings=262144, rms_norm_eps=1e-6, rope_parameters=dict(_ROPE), num_experts=128,
        num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True,
    ),
)


# Qwen2-VL and Qwen2.5-VL: patch 14 (images are multiples of 28 pixels), no deepstack.
_ROPE_QWEN2 = dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[16, 24, 24])
_QWEN2_VISION = dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_act="quick_gelu", in_channels=3,
                     patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
_QWEN25_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, hidden_act="silu",
                      in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                      fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2)


def _qwen2_text(hidden, intermediate, layers, heads, kv_heads, vocab, tie):
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_act="silu",
                max_position_embeddings=128000, rms_norm_eps=1e-6, rope_parameters=dict(_ROPE_QWEN2),
                tie_word_embeddings=tie)


# Qwen/Qwen2-VL-2B-Instruct and -7B-Instruct, Qwen/Qwen2.5-VL-3B-Instruct and -7B-Instruct (values as published).
_QWEN2_VL_2B = dict(model_type="qwen2_vl", tie_word_embeddings=True, **_QWEN_TOKENS,
                    vision_config=dict(_QWEN2_VISION, hidden_size=1536),
                    text_config=_qwen2_text(1536, 8960, 28, 12, 2, 151936, True))
_QWEN2_VL_7B = dict(model_type="qwen2_vl", tie_word_embeddings=False, **_QWEN_TOKENS,
                    vision_config=dict(_QWEN2_VISION, hidden_size=3584),
                    text_config=_qwen2_text(3584, 18944, 28, 28, 4, 152064, False))
_QWEN25_VL_3B = dict(model_type="qwen2_5_vl", tie_word_embeddings=True, **_QWEN_TOKENS,
                     vision_config=dict(_QWEN25_VISION, out_hidden_size=2048),
                     text_config=_qwen2_text(2048, 11008, 36, 16, 2, 151936, True))
_QWEN25_VL_7B = dict(model_type="qwen2_5_vl", tie_word_embeddings=False, **_QWEN_TOKENS,
                     vision_config=dict(_QWEN25_VISION, out_hidden_size=3584),
                     text_config=_qwen2_text(3584, 18944, 28, 28, 4, 152064, False))

_TINY_IDS = dict(image_token_id=1000, video_token_id=1001, vision_start_token_id=1002, vision_end_token_id=1003)
_TINY_QWEN2_TEXT = dict(_qwen2_text(64, 128, 2, 4, 2, 1024, False), bos_token_id=None, eos_token_id=None,
                        rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[2, 3, 3]))
_QWEN2_VL_TINY = dict(model_type="qwen2_vl", tie_word_embeddings=False, **_TINY_IDS,
                      vision_config=dict(_QWEN2_VISION, depth=2, embed_dim=32, num_heads=2, mlp_ratio=2,
                                         hidden_size=64),
                      text_config=_TINY_QWEN2_TEXT)
# Window 112 px = 4x4 merged patches, so test images larger than that get several (padded) windows.
_QWEN25_VL_TINY = dict(model_type="qwen2_5_vl", tie_word_embeddings=False, **_TINY_IDS,
                       vision_config=dict(_QWEN25_VISION, depth=4, hidden_size=32, intermediate_size=64,
                                          num_heads=2, out_hidden_size=64, fullatt_block_indexes=[1, 3]),
                       text_config=_TINY_QWEN2_TEXT)


# Qwen3.5: Qwen3-VL's vision tower (no deepstack) before a hybrid text model, where every fourth layer
# is full (gated) attention and the others gated-DeltaNet linear attention. Qwen/Qwen3.5-9B as its model
# card gives it: hidden 4096, 32 layers, DeltaNet 16 QK / 32 V heads of 128, attention 16 Q / 4 KV heads
# of 256 with rotary on 64 dims (M-RoPE sections 11/11/10, theta 1e7), FFN 12288, vocabulary 248320.
# Qwen/Qwen3.5-35B-A3B as Transformers' configuration defaults give it (they are documented as that
# checkpoint): hidden 2048, 40 layers, 256 experts of 512 (8 per token) and a shared expert of 512.
# Padding ids: padded positions are masked, so any id serves; these are not taken from a tokenizer.
_QWEN35_IDS = dict(image_token_id=248056, video_token_id=248057, vision_start_token_id=248053,
                   vision_end_token_id=248054)
_QWEN35_ROPE = dict(rope_type="default", rope_theta=10_000_000, mrope_section=[11, 11, 10], mrope_interleaved=True,
                    partial_rotary_factor=0.25)
_QWEN35_VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, hidden_act="gelu_pytorch_tanh",
                      in_channels=3, patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                      num_position_embeddings=2304)
_QWEN35_LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                      linear_num_key_heads=16, linear_num_value_heads=32, head_dim=256, vocab_size=248320,
                      max_position_embeddings=262144, rms_norm_eps=1e-6, rope_parameters=dict(_QWEN35_ROPE))
_QWEN35_9B = dict(model_type="qwen3_5", tie_word_embeddings=False, **_QWEN35_IDS,
                  vision_config=dict(_QWEN35_VISION, out_hidden_size=4096),
                  text_config=dict(_QWEN35_LINEAR, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                                   num_attention_heads=16, num_key_value_heads=4))
_QWEN35_35B_A3B = dict(model_type="qwen3_5_moe", tie_word_embeddings=False, **_QWEN35_IDS,
                       vision_config=dict(_QWEN35_VISION, out_hidden_size=2048),
                       text_config=dict(_QWEN35_LINEAR, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                                        num_key_value_heads=2, num_experts=256, num_experts_per_tok=8,
                                        moe_intermediate_size=512, shared_expert_intermediate_size=512))
# Tiny: the real layout rules (patch 16, merge 2, a learned position table, full attention every 4th layer).
_QWEN35_TINY = dict(model_type="qwen3_5", tie_word_embeddings=False, **_TINY_IDS,
                    vision_config=dict(_QWEN35_VISION, depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                       out_hidden_size=64, num_position_embeddings=64),
                    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                                     linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096,
                                     rms_norm_eps=1e-6, rope_parameters=dict(_QWEN35_ROPE, mrope_section=[1, 1, 0])))
_QWEN35_MOE_TINY = copy.deepcopy(_QWEN35_TINY)
_QWEN35_MOE_TINY["model_type"] = "qwen3_5_moe"
_QWEN35_MOE_TINY["text_config"].update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=32)


PRESETS: dict[str, Preset] = {
    "qwen3-vl-tiny": Preset("qwen3-vl-tiny", _QWEN3_VL_TINY, 0, "tiny Qwen3-VL for tests (vision depth 4)"),
    "qwen3-vl-2b": Preset("qwen3-vl-2b", _QWEN3_VL_2B, 151643, "Qwen3-VL-2B-Instruct shapes, random weights"),
    "qwen3-vl-8b": Preset("qwen3-vl-8b", _QWEN3_VL_8B, 151643, "Qwen3-VL-8B-Instruct shapes, random weights"),
    "qwen3-vl-moe-tiny": Preset("qwen3-vl-moe-tiny", _QWEN3_VL_MOE_TINY, 0, "tiny Qwen3-VL-MoE for tests"),
    "qwen3-vl-30b-a3b": Preset("qwen3-vl-30b-a3b", _QWEN3_VL_30B_A3B, 151643,
                               "Qwen3-VL-30B-A3B-Instruct shapes, random weights"),
    "qwen2-vl-tiny": Preset("qwen2-vl-tiny", _QWEN2_VL_TINY, 0, "tiny Qwen2-VL for tests"),
    "qwen2-vl-2b": Preset("qwen2-vl-2b", _QWEN2_VL_2B, 151643, "Qwen2-VL-2B-Instruct shapes, random weights"),
    "qwen2-vl-7b": Preset("qwen2-vl-7b", _QWEN2_VL_7B, 151643, "Qwen2-VL-7B-Instruct shapes, random weights"),
    "qwen2.5-vl-tiny": Preset("qwen2.5-vl-tiny", _QWEN25_VL_TINY, 0, "tiny Qwen2.5-VL for tests (window attention)"),
    "qwen2.5-vl-3b": Preset("qwen2.5-vl-3b", _QWEN25_VL_3B, 151643, "Qwen2.5-VL-3B-Instruct shapes, random weights"),
    "qwen2.5-vl-7b": Preset("qwen2.5-vl-7b", _QWEN25_VL_7B, 151643, "Qwen2.5-VL-7B-Instruct shapes, random weights"),
    "qwen3.5-tiny": Preset("qwen3.5-tiny", _QWEN35_TINY, 0, "tiny Qwen3.5 for tests (hybrid text model)"),
    "qwen3.5-moe-tiny": Preset("qwen3.5-moe-tiny", _QWEN35_MOE_TINY, 0, "tiny Qwen3.5-MoE for tests"),
    "qwen3.5-9b": Preset("qwen3.5-9b", _QWEN35_9B, 0, "Qwen3.5-9B shapes, random weights"),
    "qwen3.5-35b-a3b": Preset("qwen3.5-35b-a3b", _QWEN35_35B_A3B, 0, "Qwen3.5-35B-A3B shapes, random weights"),
}

# model_type -> the vision tower's class (``build_vision_model`` builds it alone).
VISION_CLASSES = {"qwen3_vl": "Qwen3VLVisionModel", "qwen3_vl_moe": "Qwen3VLMoeVisionModel",
                  "qwen3_5": "Qwen3_5VisionModel", "qwen3_5_moe": "Qwen3_5MoeVisionModel",
                  "qwen2_vl": "Qwen2VisionTransformerPretrainedModel",
                  "qwen2_5_vl": "Qwen2_5_VisionTransformerPretrainedModel"}
