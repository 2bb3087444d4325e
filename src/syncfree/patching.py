"""``patch`` / ``unpatch``: a registry keyed by ``config.model_type``, fingerprints, apply and restore.

Before a Transformers function is replaced, its fingerprint is checked: the
parameters it takes and the lines of code the replacement relies on. If the
installed Transformers changed underneath, syncfree refuses with a message
naming the version, instead of patching blindly.
"""

from __future__ import annotations

import importlib
import inspect
import types
from dataclasses import dataclass

import torch

__all__ = ["patch", "unpatch", "is_patched", "UnsupportedTransformers", "FAMILIES"]


class UnsupportedTransformers(RuntimeError):
    """The installed Transformers' code is not the code a syncfree patch was written for."""


@dataclass(frozen=True)
class Target:
    cls: str  # class name in the family's modeling module
    attr: str  # method name
    factory: str  # name of the make_* function in the adapter module
    params: tuple[str, ...]  # parameters the stock function must take
    needs: tuple[str, ...]  # code the replacement relies on (or replaces); each must appear in the stock source


@dataclass(frozen=True)
class Family:
    model_type: str
    modeling: str  # transformers module
    adapter: str  # syncfree module with the make_* functions
    targets: tuple[Target, ...]

    def module(self):
        return importlib.import_module(self.modeling)


_ATTENTION_NEEDS = ("lengths.tolist()", "is_flash_attention_requested(self.config)", "apply_rotary_pos_emb_vision",
                    "self.qkv(hidden_states)", "self.proj(attn_output)")
_MODEL_PARAMS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "pixel_values_videos",
                 "image_grid_thw", "video_grid_thw", "mm_token_type_ids")
_MODEL_NEEDS = ("get_placeholder_mask(", "masked_scatter(", "compute_3d_position_ids(", "self.language_model(")
_ROPE_PARAMS = ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw", "attention_mask")
_ROPE_NEEDS = ("max(grid_thw[1], grid_thw[2]) // spatial_merge_size", "llm_positions.max() + 1 - len(current_input_ids)",
               "mm_token_type_ids[batch_idx]")
_VISION_NEEDS = ("get_vision_position_ids(grid_thw", "get_vision_attention_seqlens(grid_thw", "kwargs=kwargs",
                 "**kwargs,")


def _generation(cls: str) -> Target:
    return Target(cls, "forward", "make_generation_forward",
                  ("input_ids", "pixel_values", "image_grid_thw", "video_grid_thw", "mm_token_type_ids", "kwargs"),
                  ("self.model(",))


def _qwen3_vl_targets(prefix: str) -> tuple[Target, ...]:
    return (
        Target(f"{prefix}VisionAttention", "forward", "make_attention_forward",
               ("hidden_states", "cu_seqlens", "position_embeddings", "max_seqlen"), _ATTENTION_NEEDS),
        Target(f"{prefix}VisionModel", "forward", "make_vision_forward", ("hidden_states", "grid_thw"),
               _VISION_NEEDS + ("get_vision_interpolation_indices_and_weights(",)),
        Target(f"{prefix}Model", "forward", "make_model_forward", _MODEL_PARAMS,
               _MODEL_NEEDS + ("deepstack_visual_embeds",)),
        Target(f"{prefix}Model", "get_rope_index", "make_get_rope_index", _ROPE_PARAMS,
               _ROPE_NEEDS + ("video_grid_thw[:, 0] = 1",)),
        _generation(f"{prefix}ForConditionalGeneration"),
        Target(f"{prefix}TextModel", "_deepstack_process", "make_deepstack_process",
               ("hidden_states", "visual_pos_masks", "visual_embeds"),
               ("hidden_states[visual_pos_masks, :] + visual_embeds", "hidden_states.clone()")),
    )


def _qwen2_vl_targets(attention: str, vision: str, prefix: str, window: bool) -> tuple[Target, ...]:
    return (
        Target(attention, "forward", "make_attention_forward",
               ("hidden_states", "cu_seqlens", "position_embeddings", "max_seqlen"), _ATTENTION_NEEDS),
        Target(vision, "forward", "make_vision_forward", ("hidden_states", "grid_thw"),
               _VISION_NEEDS + (("get_vision_window_index(", 'kwarg_name="max_window_seqlen"') if window
                                else ())),
        Target(f"{prefix}Model", "forward", "make_model_forward", _MODEL_PARAMS, _MODEL_NEEDS),
        Target(f"{prefix}Model", "get_rope_index", "make_get_rope_index", _ROPE_PARAMS,
               _ROPE_NEEDS + (("tokens_per_second * ",) if window else ())),
        _generation(f"{prefix}ForConditionalGeneration"),
    )


FAMILIES: dict[str, Family] = {
    "qwen3_vl": Family("qwen3_vl", "transformers.models.qwen3_vl.modeling_qwen3_vl", "syncfree.models.qwen_vl",
                       _qwen3_vl_targets("Qwen3VL")),
    "qwen3_vl_moe": Family("qwen3_vl_moe", "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe",
                           "syncfree.models.qwen_vl", _qwen3_vl_targets("Qwen3VLMoe")),
    "qwen2_vl": Family("qwen2_vl", "transformers.models.qwen2_vl.modeling_qwen2_vl", "syncfree.models.qwen_vl",
                       _qwen2_vl_targets("VisionAttention", "Qwen2VisionTransformerPretrainedModel", "Qwen2VL",
                                         window=False)),
    "qwen2_5_vl": Family("qwen2_5_vl", "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "syncfree.models.qwen_vl",
                         _qwen2_vl_targets("Qwen2_5_VLVisionAttention", "Qwen2_5_VisionTransformerPretrainedModel",
                                           "Qwen2_5_VL", window=True)),
}

# Stock functions replaced at class level: (class, attr) -> stock function.
_class_patches: dict[tuple[type, str], object] = {}


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _stock(cls: type, attr: str):
    """The stock function, also when the class is already patched."""
    current = cls.__dict__.get(attr)
    return _class_patches.get((cls, attr), current)


def _check(family: Family, target: Target, fn) -> None:
    where = f"{target.cls}.{target.attr}"
    problem = None
    if fn is None:
        problem = "it does not exist"
    else:
        params = set(inspect.signature(fn).parameters)
        missing = [p for p in target.params if p not in params]
        source = inspect.getsource(inspect.unwrap(fn))
        absent = [code for code in target.needs if code not in source]
        if missing:
            problem = f"its parameters lack {missing}"
        elif absent:
            problem = f"its code no longer contains {absent}"
    if problem:
        raise UnsupportedTransformers(
            f"syncfree cannot patch {family.model_type}: in the installed Transformers {_transformers_version()}, "
            f"{where} is not the function syncfree's patch was written for ({problem}). Nothing was patched. "
            "syncfree supports Transformers 5.17.0 through the releases it was tested with; please report the "
            "version."
        )


def _replacements(family: Family) -> list[tuple[type, Target, object]]:
    """Check every target first, then build every replacement: all or nothing."""
    module = family.module()
    adapter = importlib.import_module(family.adapter)
    found = []
    for target in family.targets:
        cls = getattr(module, target.cls, None)
        if cls is None:
            raise UnsupportedTransformers(
                f"syncfree cannot patch {family.model_type}: Transformers {_transformers_version()} has no "
                f"{target.cls}. Nothing was patched.")
        stock = _stock(cls, target.attr)
        _check(family, target, stock)
        found.append((cls, target, stock))
    return [(cls, target, getattr(adapter, target.factory)(stock)) for cls, target, stock in found]


def _family_of(model: torch.nn.Module) -> Family:
    for module in model.modules():
        config = getattr(module, "config", None)
        model_type = getattr(config, "model_type", None) or ""
        # A vision tower or text model alone carries the sub-config's type ("qwen3_vl_vision").
        for name in (model_type, model_type.removesuffix("_vision"), model_type.removesuffix("_text")):
            if name in FAMILIES:
                return FAMILIES[name]
    types_seen = sorted({getattr(getattr(m, "config", None), "model_type", None) or "" for m in model.modules()} - {""})
    raise ValueError(f"syncfree.patch: no supported model in {type(model).__name__} (model types found: "
                     f"{types_seen or 'none'}; supported: {', '.join(FAMILIES)})")


def patch(model: torch.nn.Module | None = None, *, families: tuple[str, ...] | None = None):
    """Make the multimodal forward free of host syncs.

    With a model (``*ForConditionalGeneration``, ``*Model``, ``*VisionModel``, also inside a
    PEFT wrapper), patch that instance and return it. Without one, patch the classes, so
    every model of these families built afterwards (and already built) is patched.
    """
    if model is None:
        for name in families or tuple(FAMILIES):
            for cls, target, replacement in _replacements(FAMILIES[name]):
                _class_patches.setdefault((cls, target.attr), cls.__dict__[target.attr])
                setattr(cls, target.attr, replacement)
        return None
    family = _family_of(model)
    replacements = {(cls, t.attr): r for cls, t, r in _replacements(family)}
    patched = 0
    for module in model.modules():
        for (cls, attr), replacement in replacements.items():
            if isinstance(module, cls):
                setattr(module, attr, types.MethodType(replacement, module))
                module.__dict__.setdefault("_syncfree_patched", set()).add(attr)
                patched += 1
    if not patched:
        raise ValueError(f"syncfree.patch: {type(model).__name__} holds no module that syncfree patches")
    return model


def unpatch(model: torch.nn.Module | None = None) -> None:
    """Undo ``patch``: restore the stock functions exactly (on the instance, or on the classes)."""
    if model is None:
        for (cls, attr), stock in list(_class_patches.items()):
            setattr(cls, attr, stock)
            del _class_patches[(cls, attr)]
        return
    for module in model.modules():
        for attr in module.__dict__.pop("_syncfree_patched", ()):
            module.__dict__.pop(attr, None)


def is_patched(model: torch.nn.Module) -> bool:
    """True when ``model`` (or its classes) runs syncfree's forward."""
    return any("_syncfree_patched" in m.__dict__ or (type(m), "forward") in _class_patches for m in model.modules())
