"""Omni thinker presets (Qwen3-Omni-MoE, Qwen2.5-Omni): config values for random-weight thinkers, tiny ones for tests.

syncfree patches the *thinker* (audio encoder + vision tower + text model), the part that reads the
inputs and writes text; the talker and the waveform decoder are other models. The real-shape
presets are written from the published configs' ``thinker_config`` (Qwen/Qwen3-Omni-30B-A3B-Instruct,
Qwen/Qwen2.5-Omni-7B); nothing is downloaded.
"""

from __future__ import annotations

import copy
import importlib

__all__ = ["OMNI_PRESETS", "THINKER_CLASSES", "thinker_class"]

THINKER_CLASSES = {"qwen3_omni_moe_thinker": ("qwen3_omni_moe", "Qwen3OmniMoeThinkerForConditionalGeneration"),
                   "qwen2_5_omni_thinker": ("qwen2_5_omni", "Qwen2_5OmniThinkerForConditionalGeneration")}


def thinker_class(model_type: str):
    folder, name = THINKER_CLASSES[model_type]
    return getattr(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"), name)


# Qwen3-Omni: Qwen3-VL's vision tower (patch 16, learned positions, deepstack), a Whisper-style audio encoder
# with three stride-2 convolutions per 100-frame chunk, and a Qwen3-MoE text model. The end tokens are the
# tokenizer's (the model does not read them; ``inputs`` lays them out).
_QWEN3_OMNI_IDS = dict(audio_token_id=151675, image_token_id=151655, video_token_id=151656,
                       vision_start_token_id=151652, audio_start_token_id=151669, vision_end_token_id=151653,
                       audio_end_token_id=151670, position_id_per_seconds=13)
_QWEN3_OMNI_30B_A3B = dict(
    model_type="qwen3_omni_moe_thinker", **_QWEN3_OMNI_IDS,
    audio_config=dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, num_mel_bins=128,
                      output_dim=2048, n_window=50, n_window_infer=800, conv_chunksize=500, downsample_hidden_size=480,
                      max_source_positions=1500),
    vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=2048,
                       hidden_act="gelu_pytorch_tanh", patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                       num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24]),
    text_config=dict(vocab_size=152064, hidden_size=2048, intermediate_size=768, num_hidden_layers=48,
                     num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                     moe_intermediate_size=768, max_position_embeddings=65536, rms_norm_eps=1e-6,
                     rope_parameters=dict(rope_type="default", rope_theta=1_000_000, mrope_section=[24, 20, 20],
                                          mrope_interleaved=True)),
)
_TINY_IDS = dict(image_token_id=1000, video_token_id=1001, audio_token_id=1002, vision_start_token_id=1003,
                 audio_start_token_id=1004, vision_end_token_id=1005, audio_end_token_id=1006)
_QWEN3_OMNI_TINY = dict(
    model_type="qwen3_omni_moe_thinker", **_TINY_IDS, position_id_per_seconds=13,
    audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128,
                      output_dim=64, n_window=50, n_window_infer=200, downsample_hidden_size=16),
    vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       num_position_embeddings=64, deepstack_visual_indexes=[0]),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     rope_parameters=dict(rope_type="default", rope_theta=1_000_000, mrope_section=[2, 3, 3],
                                          mrope_interleaved=True)),
)

# Qwen2.5-Omni: Qwen2.5-VL's vision tower (patch 14, windows), a Whisper-style audio encoder (one stride-2
# convolution, attention per 200-frame chunk, pooling), and a Qwen2.5 text model.
_QWEN25_OMNI_IDS = dict(audio_token_index=151646, image_token_index=151655, video_token_index=151656,
                        vision_start_token_id=151652, vision_end_token_id=151653, audio_start_token_id=151647,
                        audio_end_token_id=151648, position_id_per_seconds=25, seconds_per_chunk=2)
_QWEN25_OMNI_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                           hidden_act="silu", patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[7, 15, 23, 31])
_QWEN25_OMNI_7B = dict(
    model_type="qwen2_5_omni_thinker", **_QWEN25_OMNI_IDS,
    audio_config=dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, num_mel_bins=128,
                      output_dim=3584, n_window=100, max_source_positions=1500),
    vision_config=_QWEN25_OMNI_VISION,
    text_config=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                     num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
                     rope_parameters=dict(rope_type="default", rope_theta=1_000_000, mrope_section=[16, 24, 24])),
)
_QWEN25_OMNI_TINY = dict(
    model_type="qwen2_5_omni_thinker", audio_token_index=1002, image_token_index=1000, video_token_index=1001,
    vision_start_token_id=1003, audio_start_token_id=1004, vision_end_token_id=1005, audio_end_token_id=1006,
    position_id_per_seconds=25, seconds_per_chunk=2,
    audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128,
                      output_dim=64, n_window=100),
    vision_config=dict(_QWEN25_OMNI_VISION, depth=4, hidden_size=32, intermediate_size=64, num_heads=2,
                       out_hidden_size=64, fullatt_block_indexes=[1, 3]),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, rope_parameters=dict(rope_type="default", rope_theta=1_000_000,
                                                                 mrope_section=[2, 3, 3])),
)

# name -> (values, pad id, what it is)
OMNI_PRESETS = {
    "qwen3-omni-tiny": (_QWEN3_OMNI_TINY, 0, "tiny Qwen3-Omni-MoE thinker for tests"),
    "qwen3-omni-30b-a3b": (_QWEN3_OMNI_30B_A3B, 151643, "Qwen3-Omni-30B-A3B-Instruct thinker shapes, random weights"),
    "qwen2.5-omni-tiny": (_QWEN25_OMNI_TINY, 0, "tiny Qwen2.5-Omni thinker for tests (window attention)"),
    "qwen2.5-omni-7b": (_QWEN25_OMNI_7B, 151643, "Qwen2.5-Omni-7B thinker shapes, random weights"),
}
OMNI_PRESETS = {k: (copy.deepcopy(v), pad, about) for k, (v, pad, about) in OMNI_PRESETS.items()}
