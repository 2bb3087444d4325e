"""What every family shares: the Transformers module-level functions syncfree patches once for all of them,
and what the wrappers of a Qwen-VL-style vision tower and multimodal forward rely on in the stock code."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from ..rewrite.edits import (
    CONV_PREFILL,
    FEATURE_SCATTER,
    FEATURE_SPLIT,
    GENERATION_POSITIONS,
    LINEAR_LENGTH_TENSOR,
    PACKED_CHECK,
    PACKED_SEQUENCES,
    PLACEHOLDER_MASK,
    RECURRENT_MASK,
    ROPE_DELTAS_AFTER_CACHE,
    SLIDING_WINDOW_TAIL,
    SLIDING_WINDOW_TENSOR,
    STATIC_LENGTH_TENSOR,
    VISION_ATTENTION,
)
from ..rewrite.host_mask import make_ignore_bidirectional_mask_sdpa
from ..rewrite.targets import Target
from ..rewrite.wrappers import (
    make_generate,
    make_get_rope_index,
    make_ignore_causal_mask_sdpa,
    make_model_forward,
    make_vision_forward,
)

__all__ = ["PACKS", "MODULE_TARGETS", "VISION_NEEDS", "WINDOW_NEEDS", "MODEL_PARAMS", "MODEL_NEEDS", "family_module",
           "vlm_targets", "installed_source_has", "scale_sections"]


def family_module(folder: str) -> str:
    """The modeling module of a Transformers model folder (``qwen3_vl`` -> ``...qwen3_vl.modeling_qwen3_vl``)."""
    return f"transformers.models.{folder}.modeling_{folder}"


# A family whose patched forward keeps the samples of a padding-free packed row apart (``Layout.packing_refused``):
# shown per family by tests/test_packing.py (each sample's logits are its own run's).
PACKS = dict(packing_refused="")

# The packed vision tower (every family that copied Qwen2-VL's): the wrapper hands it the plan's tensors.
VISION_NEEDS = ("get_vision_position_ids(grid_thw", "get_vision_attention_seqlens(grid_thw", "kwargs=kwargs",
                "**kwargs,")
# The multimodal *Model.forward: the wrapper finds the plan for these arguments.
MODEL_PARAMS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "pixel_values_videos",
                "image_grid_thw", "video_grid_thw", "mm_token_type_ids")
MODEL_NEEDS = ("self.get_placeholder_mask(", "masked_scatter(", "self.compute_3d_position_ids(", "self.language_model(")
# Qwen2.5-VL's window attention (and every tower that copied it).
WINDOW_NEEDS = ("get_vision_window_index(", 'kwarg_name="max_window_seqlen"')
# The Qwen2-VL 3D rotary index (get_rope_index): syncfree's planned index computes the same.
ROPE_PARAMS = ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw", "attention_mask")
ROPE_NEEDS = ("max(grid_thw[1], grid_thw[2]) // spatial_merge_size", "llm_positions.max() + 1 - len(current_input_ids)",
              "mm_token_type_ids[batch_idx]")


def vlm_targets(attention: str, vision: str, model: str, generation: str, *, vision_needs: tuple = (),
                rope_needs: tuple | None = (), model_edits: tuple = (), vision_module: str | None = None,
                vision_wrap: Callable = make_vision_forward, vision_edits: tuple = (),
                attention_edits: tuple = VISION_ATTENTION, vision_params: tuple = ("hidden_states", "grid_thw"),
                base_vision_needs: tuple = VISION_NEEDS, image_only: bool = False,
                model_params: tuple = (), scatter: tuple = FEATURE_SCATTER,
                placeholder_edits: tuple = (), feature_split: tuple = FEATURE_SPLIT) -> tuple[Target, ...]:
    """The targets of a model with Qwen2-VL's packed vision tower and multimodal forward, by class name:
    the vision attention's split, the tower (handed the plan's tensors), the placeholder counts, the feature
    scatter, generate(), and the 3D rotary index with its generation-time check. ``rope_needs=None``: a family
    without a 3D rotary index (its text model numbers tokens itself; the forward takes no mm_token_type_ids).
    ``vision_module``: where the tower's classes live when the family borrows another's tower. The rest say
    how a tower differs from Qwen2-VL's (its wrapper, its own edits, the attention's edits, what the wrapper
    relies on: ``base_vision_needs + vision_needs``). ``image_only``: a forward that takes no videos (its
    placeholder and scatter code has only the image lines). ``model_params``: inputs of the multimodal forward
    beyond Qwen2-VL's that the plan keeps (ERNIE-4.5-VL's ``moe_mm_token_type_ids``). ``scatter``: the feature
    scatter's edits, where the forward names its features otherwise. ``placeholder_edits``: more edits of
    get_placeholder_mask (MiniMax-M3-VL's count check by boolean select, ``PLACEHOLDER_NUMEL``). ``feature_split``: the
    edits of get_image_features and get_video_features (image, then video) where their split sizes are spelled
    otherwise (each applies only where its code is present)."""
    placeholders, scatter = (PLACEHOLDER_MASK[:1], scatter[:1]) if image_only else (PLACEHOLDER_MASK, scatter)
    params = tuple(p for p in MODEL_PARAMS if not (image_only and p in ("pixel_values_videos", "video_grid_thw")))
    params += model_params
    targets = (
        Target(attention, "forward", edits=attention_edits, module=vision_module),
        Target(vision, "forward", edits=vision_edits, wrap=vision_wrap, params=vision_params,
               needs=base_vision_needs + vision_needs, module=vision_module),
        Target(model, "get_placeholder_mask", edits=placeholders + placeholder_edits),
        Target(generation, "generate", wrap=make_generate, inherited=True),
    ) + tuple(
        # (for a traced forward: families whose feature split reads the grid otherwise keep stock's; a family whose
        # get_video_features has no split of its own, Kimi-K2.5's, gives no video edits and gets no target there)
        Target(model, attr, edits=edits, optional=True)
        for attr, edits in (("get_image_features", feature_split[:1]), ("get_video_features", feature_split[1:]))
        if edits)
    if rope_needs is None:
        return targets + (
            Target(model, "forward", edits=scatter + model_edits, wrap=make_model_forward,
                   params=tuple(p for p in params if p != "mm_token_type_ids"),
                   needs=tuple(n for n in MODEL_NEEDS if n != "self.compute_3d_position_ids(")),)
    return targets + (
        Target(model, "forward", edits=scatter + model_edits, wrap=make_model_forward, params=params,
               needs=MODEL_NEEDS),
        Target(model, "get_rope_index", wrap=make_get_rope_index, params=ROPE_PARAMS, needs=ROPE_NEEDS + rope_needs),
        Target(generation, "_prepare_position_ids_for_generation", edits=GENERATION_POSITIONS, optional=True),
        Target(model, "compute_3d_position_ids", edits=ROPE_DELTAS_AFTER_CACHE, optional=True),
    )

# Module-level functions shared by every family: (module, function) -> target. Modules that imported
# the function by name (``from ...masking_utils import create_recurrent_attention_mask``) get it too.
MODULE_TARGETS: dict[tuple[str, str], Target] = {
    ("transformers.masking_utils", "_ignore_causal_mask_sdpa"): Target(
        "_ignore_causal_mask_sdpa", "", wrap=make_ignore_causal_mask_sdpa, params=("padding_mask",),
        needs=("fast_all(padding_mask", "is_tracing(")),
    # (dots3-note's audio frames: answered from a host copy only where its audio code made one for that very mask)
    ("transformers.masking_utils", "_ignore_bidirectional_mask_sdpa"): Target(
        "_ignore_bidirectional_mask_sdpa", "", wrap=make_ignore_bidirectional_mask_sdpa, params=("padding_mask",),
        needs=("padding_mask.all()", "is_tracing("), optional=True),
    ("transformers.masking_utils", "create_recurrent_attention_mask"): Target(
        "create_recurrent_attention_mask", "", edits=RECURRENT_MASK, optional=True),
    ("transformers.masking_utils", "find_packed_sequence_indices"): Target(
        "find_packed_sequence_indices", "", edits=PACKED_CHECK, optional=True),
    # (a packed batch's masks: the plan's sequence ids, syncfree.packing_collator)
    ("transformers.masking_utils", "_preprocess_mask_arguments"): Target(
        "_preprocess_mask_arguments", "", edits=PACKED_SEQUENCES, optional=True),
    # A class's method ("Class.method"): the class itself is patched.
    ("transformers.cache_utils", "DynamicSlidingWindowLayer.lazy_initialization"): Target(
        "DynamicSlidingWindowLayer", "lazy_initialization", edits=SLIDING_WINDOW_TENSOR, optional=True),
    # (the window's tail without a guard on the text's length: one traced graph for texts shorter and longer)
    ("transformers.cache_utils", "DynamicSlidingWindowLayer.update"): Target(
        "DynamicSlidingWindowLayer", "update", edits=SLIDING_WINDOW_TAIL, optional=True),
    ("transformers.cache_utils", "StaticLayer.lazy_initialization"): Target(
        "StaticLayer", "lazy_initialization", edits=STATIC_LENGTH_TENSOR, optional=True),
    # (a prefill shorter than the convolution's kernel padded without a guard on the text's length)
    ("transformers.cache_utils", "LinearAttentionLayer.update_conv_state"): Target(
        "LinearAttentionLayer", "update_conv_state", edits=CONV_PREFILL, optional=True),
    ("transformers.cache_utils", "LinearAttentionLayer.lazy_initialization"): Target(
        "LinearAttentionLayer", "lazy_initialization", edits=LINEAR_LENGTH_TENSOR, optional=True),
}


def installed_source_has(module: str, *needles: str) -> bool:
    """Whether the installed file of ``module`` (a modeling module, read as text: nothing imported) holds every one of
    ``needles``: a family registers only where Transformers ships the code it was written for, so that an older
    release's different code stays stock (and the class-level ``syncfree.patch()`` of every family does not refuse)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None or not spec.origin:
        return False
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    return all(needle in source for needle in needles)


def scale_sections(sections: list[int], half: int) -> list[int]:
    """M-RoPE sections scaled to sum to ``half`` (the rotary width / 2). The rounding remainder goes to a section no
    other equals (Qwen's temporal [16, 24, 24], ERNIE-4.5-VL's [22, 22, 20]: its height and width sections are
    stacked, so they must stay equal), else the first."""
    total = sum(sections)
    scaled = [max(0, s * half // total) for s in sections]
    unique = [i for i, s in enumerate(sections) if sections.count(s) == 1]
    scaled[unique[0] if unique else 0] += half - sum(scaled)
    return scaled

