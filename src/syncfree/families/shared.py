"""What every family shares: the Transformers module-level functions syncfree patches once for all of them,
and what the wrappers of a Qwen-VL-style vision tower and multimodal forward rely on in the stock code."""

from __future__ import annotations

from ..rewrite.edits import PACKED_CHECK, RECURRENT_MASK
from ..rewrite.targets import Target

__all__ = ["MODULE_TARGETS", "VISION_NEEDS", "MODEL_PARAMS", "MODEL_NEEDS", "family_module"]


def family_module(folder: str) -> str:
    """The modeling module of a Transformers model folder (``qwen3_vl`` -> ``...qwen3_vl.modeling_qwen3_vl``)."""
    return f"transformers.models.{folder}.modeling_{folder}"


# The packed vision tower (every family that copied Qwen2-VL's): the wrapper hands it the plan's tensors.
VISION_NEEDS = ("get_vision_position_ids(grid_thw", "get_vision_attention_seqlens(grid_thw", "kwargs=kwargs",
                "**kwargs,")
# The multimodal *Model.forward: the wrapper finds the plan for these arguments.
MODEL_PARAMS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "pixel_values_videos",
                "image_grid_thw", "video_grid_thw", "mm_token_type_ids")
MODEL_NEEDS = ("self.get_placeholder_mask(", "masked_scatter(", "self.compute_3d_position_ids(", "self.language_model(")

# Module-level functions shared by every family: (module, function) -> target. Modules that imported
# the function by name (``from ...masking_utils import create_recurrent_attention_mask``) get it too.
MODULE_TARGETS: dict[tuple[str, str], Target] = {
    ("transformers.masking_utils", "_ignore_causal_mask_sdpa"): Target(
        "_ignore_causal_mask_sdpa", "", wrap="make_ignore_causal_mask_sdpa", params=("padding_mask",),
        needs=("fast_all(padding_mask", "is_tracing(")),
    ("transformers.masking_utils", "create_recurrent_attention_mask"): Target(
        "create_recurrent_attention_mask", "", edits=RECURRENT_MASK, optional=True),
    ("transformers.masking_utils", "find_packed_sequence_indices"): Target(
        "find_packed_sequence_indices", "", edits=PACKED_CHECK, optional=True),
}
