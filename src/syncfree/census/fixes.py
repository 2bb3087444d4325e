"""Per-family config fixes after the generic shrink: the ties a family's config derives once, in ``__post_init__``
(so shrinking a field leaves the derived one stale), and the fields its default leaves unset that its model needs.

Each fix reads the family's configuration_*.py / modeling_*.py rules; it runs on the already shrunk config.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CONFIG_FIXES", "fix_config", "scale_sections"]


def scale_sections(sections: list[int], half: int) -> list[int]:
    """M-RoPE sections scaled to sum to ``half`` (the rotary width / 2). The rounding remainder goes to a section no
    other equals (Qwen's temporal [16, 24, 24], ERNIE-4.5-VL's [22, 22, 20]: its height and width sections are
    stacked, so they must stay equal), else the first."""
    total = sum(sections)
    scaled = [max(0, s * half // total) for s in sections]
    unique = [i for i, s in enumerate(sections) if sections.count(s) == 1]
    scaled[unique[0] if unique else 0] += half - sum(scaled)
    return scaled


def _cohere_compass(config) -> None:
    # Rope parameters are per layer type and the default names none: the rotary embedding then has no entry for
    # "full_attention". Give every kind the family's default rope (its M-RoPE sections, scaled to the head).
    text = config.text_config
    half = text.hidden_size // text.num_attention_heads // 2
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": scale_sections([24, 20, 20], half)}
    text.rope_parameters = {kind: dict(rope) for kind in dict.fromkeys(text.layer_types)}


def _qwen4_exp(config) -> None:
    # Its "indexed_attention" layers build a QSA token indexer, which the default config leaves unset (the
    # checkpoint's config sets it): one key head (required) and a rotary width that fits the index head.
    text = config.text_config
    text.indexer_n_heads, text.indexer_kv_heads = 2, 1
    text.indexer_head_dim = text.head_dim
    text.indexer_compress_ratio, text.indexer_budget = 4, 16


def _glm5_next(config) -> None:
    # Its head_dim is the rotary part of its latent attention's heads (derived once, in __post_init__).
    config.text_config.head_dim = config.text_config.qk_rope_head_dim


def _dots3_note(config) -> None:
    text, vision = config.text_config, config.vision_config
    # Its latent attention's parts, derived once per layer kind (and restated in its sliding layers' overrides): every
    # layer takes the shrunk head, half of it rotary (a sliding layer checks head_dim == nope + rope), latent ranks of
    # the text width, an indexer head of the same size, and each kind's rotary fraction recomputed (rope / head).
    parts = ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank")
    spec = vars(text).get("_heterogeneity_spec")
    kept = {i: {k: v for k, v in o.items() if k not in parts} for i, o in (spec.per_layer_overrides if spec else {}).items()}
    text.per_layer_config = None
    text.qk_rope_head_dim = text.head_dim // 2
    text.qk_nope_head_dim = text.head_dim - text.qk_rope_head_dim
    text.q_lora_rank = text.kv_lora_rank = text.hidden_size
    text.index_head_dim, text.index_n_heads = text.head_dim, 2
    text.per_layer_config = {i: o for i, o in kept.items() if o} or None
    for rope in text.rope_parameters.values():
        rope["partial_rotary_factor"] = text.qk_rope_head_dim / text.head_dim
    # The tower's MoE blocks lie past the shrunk depth (the default routes only its last 17 of 42): its second block is
    # one, of 4 experts.
    vision.mlp_layer_types = ["dense", "sparse"]
    vision.num_local_experts = 4
    # The audio encoder's attention has as many key heads as query heads (derived once).
    config.audio_config.num_key_value_heads = config.audio_config.num_attention_heads


def _minimax_m3_vl(config) -> None:
    # The projector's merge MLP takes merge**2 projected patches side by side: derived from the text width.
    config.merged_hidden_size = config.text_config.hidden_size * config.vision_config.spatial_merge_size**2


def _muse_glimmer(config) -> None:
    # The tower's pixel shuffle puts merge**2 patches side by side: the adapter takes that width.
    vision = config.vision_config
    config.out_hidden_size = vision.hidden_size * vision.merge_size**2


def _hunyuan_vl(config) -> None:
    # Its multimodal positions need M-RoPE axes (text, width, height, image index), which the checkpoint's config
    # sets and the default does not: four equal sections of the rotary half.
    text = config.text_config
    rope = dict(text.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    rope["mrope_section"] = scale_sections([1, 1, 1, 1], text.head_dim // 2)
    text.rope_parameters = rope


def _glm_image(config) -> None:
    # Its VQ-VAE quantizes the tower's features: its input width (latent_channels) is the tower's, which the shrink
    # changed (the VQ config names it otherwise).
    config.vq_config.latent_channels = config.vision_config.hidden_size


def _image_token(config) -> None:
    # The default leaves the image placeholder id unset (the checkpoint's tokenizer names it): any text id will do.
    if config.image_token_id is None:
        config.image_token_id = 5


def _qwen3_asr(config) -> None:
    # The projector after the audio encoder outputs its config's output_dim (the checkpoint's text width), which the
    # shrink leaves at its default: the text width the shrink chose.
    config.audio_config.output_dim = config.text_config.hidden_size


CONFIG_FIXES: dict[str, Callable] = {
    "cohere_compass": _cohere_compass,
    "qwen4_exp": _qwen4_exp,
    "glm5_next": _glm5_next,
    "dots3_note": _dots3_note,
    "muse_glimmer": _muse_glimmer,
    "muse_spark": _muse_glimmer,
    "hunyuan_vl": _hunyuan_vl,
    "minimax_m3_vl": _minimax_m3_vl,
    "glm_image": _glm_image,
    "minicpm_ocr": _image_token,
    "minicpmv4_6": _image_token,
    "minicpmv4_7": _image_token,
    "qwen3_asr": _qwen3_asr,
}


def fix_config(model_type: str, config) -> None:
    fix = CONFIG_FIXES.get(model_type)
    if fix is not None:
        fix(config)
