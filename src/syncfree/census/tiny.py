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

from .fixes import fix_config, scale_sections

__all__ = ["tiny_config", "build_tiny"]

_LAYERS = ("num_hidden_layers", "depth", "num_layers", "encoder_layers")
_WIDTHS = {"hidden_size": 64, "embed_dim": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
           "shared_expert_intermediate_size": 32, "ffn_dim": 128, "d_model": 64}
_HEADS = {"num_attention_heads": 4, "num_heads": 4, "num_key_value_heads": 2, "encoder_attention_heads": 4,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4}
_HEAD_DIMS = ("head_dim", "linear_key_head_dim", "linear_value_head_dim", "qk_rope_head_dim", "v_head_dim")
_EXPERTS = {"num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "first_k_dense_replace": 0, "n_group": 1, "topk_group": 1}  # (groups of experts: one)


def _default_mrope_section(model_type: str) -> list[int] | None:
    """The M-RoPE sections the family's modeling code falls back to when the config names none."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec(f"transformers.models.{model_type}.modeling_{model_type}")
    except ModuleNotFoundError:  # (no such model folder in this release)
        return None
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
    rope["mrope_section"] = scale_sections(list(rope["mrope_section"]), int(head_dim * factor) // 2)
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


# Width fields that merely restate a width, not a count or an image size; see _tie_widths.
_NOT_WIDTHS = ("vocab_size", "patch_size", "image_size", "window_size", "sliding_window", "chunk_size")


def _tie_widths(config, old: set[int], new: int) -> None:
    """Fields that must equal a shrunk width (Dots3-Note's ``adapter_in_dim`` is its tower's ``hidden_size``, its
    ``adapter_out_dim`` the text width, MiniMax-M3-VL's projector width too): every ``*_dim`` / ``*_size`` field
    still at an old width follows it."""
    for name, value in list(vars(config).items()):
        if (isinstance(value, int) and not isinstance(value, bool) and value in old and value > new
                and name.endswith(("_dim", "_size")) and name not in _NOT_WIDTHS):
            _set(config, name, new)


def _lift_per_layer(config) -> tuple[dict, list] | None:
    """A per-layer config's overrides (Transformers' ``per_layer_config``: Dots3-Note sizes its sliding layers'
    attention apart), and its layer kinds, taken off the config so that its shared fields read and shrink as any
    config's (a heterogeneous config refuses to read them); ``_restore_per_layer`` puts them back. None for others."""
    spec = vars(config).get("_heterogeneity_spec")
    if spec is None:
        return None
    lifted = copy.deepcopy(spec.per_layer_overrides), list(_get(config, "layer_types") or [])
    config.per_layer_config = None
    return lifted


def _shrunk_overrides(config, values: dict) -> dict:
    """One layer's overrides shrunk by the rules that shrink the shared fields (its head sizes from its own heads)."""
    out = dict(values)
    for name, value in {**_WIDTHS, **_HEADS, **_EXPERTS}.items():
        if isinstance(out.get(name), int) and out[name] > value:
            out[name] = value
    heads = out.get("num_attention_heads") or _get(config, "num_attention_heads") or 4
    width = out.get("hidden_size") or _get(config, "hidden_size") or 64
    for name in _HEAD_DIMS:
        if isinstance(out.get(name), int) and out[name] > 0:
            out[name] = max(8, width // heads)
    if isinstance(_get(config, "kv_lora_rank"), int) and "num_attention_heads" in out:  # (latent attention, as below)
        out["num_key_value_heads"] = out["num_attention_heads"]
    return out


def _restore_per_layer(config, lifted: tuple[dict, list] | None) -> None:
    """The lifted overrides, shrunk, back on the layers kept: each takes those of the first old layer of its kind
    (``layer_types``), or of its own index where layers have no kinds."""
    if lifted is None:
        return
    overrides, kinds = lifted
    new_kinds = _get(config, "layer_types") or []
    restored = {}
    for i in range(_get(config, "num_hidden_layers") or 0):
        j = kinds.index(new_kinds[i]) if i < len(new_kinds) and new_kinds[i] in kinds else i
        if overrides.get(j):
            restored[i] = _shrunk_overrides(config, overrides[j])
    if restored:
        config.per_layer_config = restored


def _shrink(config, out_width: int | None = None, sections: list[int] | None = None, old: set[int] = frozenset()
            ) -> None:
    """Shrink one (sub-)config in place (``old``: the widths of the other configs before shrinking)."""
    lifted = _lift_per_layer(config)
    old = {*old, *(v for v in (_get(config, "hidden_size"), _get(config, "embed_dim")) if isinstance(v, int))}
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
        # (0 turns a part off, GLM-5-Next's rotary one; None for head_dim means width // heads, but not every
        # family's code reads it so: HunYuan-VL's takes the None.)
        if isinstance(_get(config, name), int) and _get(config, name) > 0 or name == "head_dim" and name in vars(
                config) and _get(config, name) is None and _get(config, "num_attention_heads"):
            _set(config, name, head_dim)
    if isinstance(_get(config, "kv_lora_rank"), int):
        # Multi-head latent attention (DeepSeek-V3's, Kimi-K2.5's text, GLM-5-Next, HY-V4-VL): every query head has
        # its own KV head, and the query head size its config derives once is recomputed from the shrunk parts.
        _set(config, "num_key_value_heads", _get(config, "num_attention_heads"))
        if isinstance(_get(config, "qk_head_dim"), int):
            _set(config, "qk_head_dim", _get(config, "qk_rope_head_dim") + _get(config, "qk_nope_head_dim"))
    _shrink_rope(config, _get(config, "head_dim") or head_dim, sections)
    if out_width is not None and isinstance(_get(config, "out_hidden_size"), int):
        _set(config, "out_hidden_size", out_width)
    _tie_widths(config, old, width)
    _restore_per_layer(config, lifted)


def tiny_config(model_type: str):
    """The family's default config with every sub-config shrunk (vision outputs sized to the text width)."""
    from transformers import AutoConfig, PretrainedConfig

    config = copy.deepcopy(AutoConfig.for_model(model_type))
    subs = {k: v for k, v in vars(config).items() if isinstance(v, PretrainedConfig)}
    text = subs.get("text_config")
    # Widths before shrinking, which a projector or adapter field may restate (they all shrink to the same width).
    old = {_get(sub, name) for sub in subs.values() for name in ("hidden_size", "embed_dim")} - {None}
    if text is not None:
        # (A text model borrowed from another family, GLM-4.6V's glm4v_text: that family's code has the default.)
        owner = getattr(text, "model_type", "").removesuffix("_text")
        _shrink(text, sections=_default_mrope_section(model_type) or _default_mrope_section(owner))
    for name, sub in subs.items():
        if name != "text_config":
            _shrink(sub, out_width=getattr(text, "hidden_size", None), old=old)
    if not subs:
        _shrink(config)
    else:
        _tie_widths(config, old, _WIDTHS["hidden_size"])  # (projector widths on the outer config)
    fix_config(model_type, config)
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
