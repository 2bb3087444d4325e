"""A tiny random-weight model of any family, from its own config class, and a Qwen-VL-style batch for it.

The config class's defaults are shrunk in place: depths to 2 layers, widths to a few dozen units,
expert counts to a handful, keeping what ties values together (heads x head size, the rotary
sections summing to half the rotary width, layer-type lists as long as the layer count, deepstack
and full-attention indexes inside the depth). The vocabulary is kept, so the special token ids stay
valid. Families whose config or inputs follow other rules fail to build or to run; the census lists
them with the reason.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["tiny_config", "build_tiny", "qwen_vl_style_batch"]

_LAYERS = ("num_hidden_layers", "depth", "num_layers", "encoder_layers")
_WIDTHS = {"hidden_size": 64, "embed_dim": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
           "shared_expert_intermediate_size": 32, "ffn_dim": 128, "d_model": 64}
_HEADS = {"num_attention_heads": 4, "num_heads": 4, "num_key_value_heads": 2, "encoder_attention_heads": 4,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4}
_HEAD_DIMS = ("head_dim", "linear_key_head_dim", "linear_value_head_dim", "qk_rope_head_dim", "v_head_dim")
_EXPERTS = {"num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "first_k_dense_replace": 0}


def _default_mrope_section(model_type: str) -> list[int] | None:
    """The M-RoPE sections the family's modeling code falls back to when the config names none."""
    import importlib.util
    import re

    spec = importlib.util.find_spec(f"transformers.models.{model_type}.modeling_{model_type}")
    if spec is None or spec.origin is None:
        return None
    with open(spec.origin, encoding="utf-8") as f:
        found = re.search(r'get\("mrope_section",\s*\[([\d,\s]+)\]\)', f.read())
    return [int(x) for x in found.group(1).split(",")] if found else None


def _shrink_rope(config, head_dim: int, default_sections: list[int] | None = None) -> None:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if isinstance(rope, dict) and not rope.get("mrope_section") and default_sections:
        rope = {**rope, "mrope_section": list(default_sections)}
    if not isinstance(rope, dict) or not rope.get("mrope_section"):
        return
    factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    half = int(head_dim * factor) // 2
    sections = list(rope["mrope_section"])
    total = sum(sections)
    scaled = [max(0, s * half // total) for s in sections]
    # The rounding remainder goes to a section no other equals (Qwen's temporal [16, 24, 24], ERNIE-4.5-VL's
    # [22, 22, 20]: its height and width sections are stacked, so they must stay equal), else the first.
    unique = [i for i, s in enumerate(sections) if sections.count(s) == 1]
    scaled[unique[0] if unique else 0] += half - sum(scaled)
    rope["mrope_section"] = scaled
    # The attribute may hand out a standardized copy: set it back.
    _set(config, "rope_parameters" if getattr(config, "rope_parameters", None) is not None else "rope_scaling", rope)


def _set(config, name: str, value) -> None:
    try:
        setattr(config, name, value)
    except Exception:  # read-only properties and per-layer attributes stay as they are
        pass


def _get(config, name: str):
    try:
        return getattr(config, name, None)
    except Exception:  # per-layer attributes refuse a global read
        return None


def _shrink(config, out_width: int | None = None, sections: list[int] | None = None) -> None:
    """Shrink one (sub-)config in place."""
    for name in _LAYERS:
        if isinstance(_get(config, name), int) and _get(config, name) > 2:
            _set(config, name, 2)
    layers = next((_get(config, n) for n in _LAYERS if isinstance(_get(config, n), int)), None)
    if layers is not None:
        kinds = _get(config, "layer_types")
        if isinstance(kinds, list) and kinds:
            # Keep one layer of each kind (hybrid models need an attention layer and a linear one).
            distinct = list(dict.fromkeys(kinds))
            _set(config, "layer_types", (distinct * layers)[:max(layers, 1)] if len(distinct) <= layers
                 else distinct[:layers])
        for name in ("deepstack_visual_indexes", "fullatt_block_indexes"):
            if isinstance(_get(config, name), list):
                _set(config, name, list(range(layers))[-1:] if name == "fullatt_block_indexes" else [0])
    for name, value in {**_WIDTHS, **_HEADS, **_EXPERTS}.items():
        if isinstance(_get(config, name), int) and _get(config, name) > value:
            _set(config, name, value)
    heads = _get(config, "num_attention_heads") or _get(config, "num_heads") or 4
    width = _get(config, "hidden_size") or _get(config, "embed_dim") or 64
    head_dim = max(8, width // heads)
    for name in _HEAD_DIMS:
        if isinstance(_get(config, name), int):
            _set(config, name, head_dim)
    _shrink_rope(config, _get(config, "head_dim") or head_dim, sections)
    if out_width is not None and isinstance(_get(config, "out_hidden_size"), int):
        _set(config, "out_hidden_size", out_width)


def tiny_config(model_type: str):
    """The family's default config with every sub-config shrunk (vision outputs sized to the text width)."""
    from transformers import AutoConfig, PretrainedConfig

    config = copy.deepcopy(AutoConfig.for_model(model_type))
    subs = {k: v for k, v in vars(config).items() if isinstance(v, PretrainedConfig)}
    text = subs.get("text_config")
    if text is not None:
        # (A text model borrowed from another family, GLM-4.6V's glm4v_text: that family's code has the default.)
        owner = getattr(text, "model_type", "").removesuffix("_text")
        _shrink(text, sections=_default_mrope_section(model_type) or _default_mrope_section(owner))
    for name, sub in subs.items():
        if name != "text_config":
            _shrink(sub, out_width=getattr(text, "hidden_size", None))
    if not subs:
        _shrink(config)
    for config_ in [config, *subs.values()]:
        config_._attn_implementation = "sdpa"
    return config


def build_tiny(model_type: str, seed: int = 0):
    """A tiny model of the family: its image-text-to-text class, else its base model, in eval mode."""
    from transformers import AutoModel, AutoModelForImageTextToText

    config = tiny_config(model_type)
    last = None
    for attn in ("sdpa", "eager"):  # some families have no SDPA path
        for auto in (AutoModelForImageTextToText, AutoModel):  # not every family registers image-text-to-text
            try:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    return auto.from_config(copy.deepcopy(config), attn_implementation=attn).eval()
            except ValueError as exc:
                last = exc
    raise last


def qwen_vl_style_batch(model, images: int = 2, text: int = 6) -> dict:
    """Flattened patches, ``image_grid_thw``, image placeholders in ``input_ids`` and ``mm_token_type_ids``."""
    config = model.config
    vc = getattr(config, "vision_config", None)
    image_token = getattr(config, "image_token_id", None)
    if image_token is None:
        image_token = getattr(config, "image_token_index", None)
    if vc is None or image_token is None or not isinstance(getattr(vc, "patch_size", None), int):
        raise ValueError("no vision_config with an int patch_size and no image token id: not a Qwen-VL-style input")
    merge = getattr(vc, "spatial_merge_size", 1) or 1
    temporal = getattr(vc, "temporal_patch_size", 1) or 1
    channels = getattr(vc, "in_channels", None) or getattr(vc, "num_channels", 3)
    gen = torch.Generator().manual_seed(0)
    grids, ids, types = [], [], []
    for i in range(images):
        h = w = 2 * merge * (i + 1)
        grids.append([1, h, w])
        tokens = h * w // merge**2
        ids += [11 + i] * text + [image_token] * tokens
        types += [0] * text + [1] * tokens
    ids += [12] * text
    types += [0] * text
    grid = torch.tensor(grids)
    patches = int(grid.prod(-1).sum())
    batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
             "pixel_values": torch.randn(patches, channels * temporal * vc.patch_size**2, generator=gen),
             "image_grid_thw": grid, "mm_token_type_ids": torch.tensor([types])}
    return batch
