"""Ovis2.5: a SigLIP2 NaViT tower (window and full layers, 2D axial rotary ids, a learned position table resampled
bicubically), a visual tokenizer and embedding table outside it, before Qwen3's text model, without 3D positions.

What is its own, beside the Qwen-VL pieces it shares:

* no rotary index: the text model numbers tokens itself and the processor returns no ``mm_token_type_ids`` (the
  EXAONE-4.5 layout: the plan computes no positions, counts placeholders);
* the tower takes ``pixel_values``; its embeddings resample the learned ``image_size // patch_size`` table bicubically
  without aligned corners, in spatial-merge order (``interp_mode``, ``table_side_from_image_size``, read
  ``interpolation_align_corners``), and its helpers give Qwen2.5-VL's windows (``window_size`` pixels) and rotary
  ids: each is popped from its ``kwargs``, so the plan's tables made on the device stand in for them. Its blocks get
  the tower's ``**kwargs`` (the plan's sizes of both segmentations; the attention picks its own by count) and each
  block's attention collects its segments' weights in a loop (``VISION_ATTENTION_WEIGHTS``);
* ``get_image_features`` splits by ``image_grid_thw.prod(dim=1) // merge**2``: on the plan's host grid, no sync; the
  visual tokenizer and embedding table sit outside the tower (``vision_every_step`` is refused);
* ``_merge_visual_features`` scatters each kind's features into its placeholders (by the plan's positions) and
  replaces the boundary tokens around each image or video by the learned indicator embeddings, after checking that
  there are as many of each as images or videos: that count is the plan's, of the boundary id in its host copy of
  ``input_ids`` (``boundaries.token_count``), so the check, its message and its error stay stock's.
"""

from __future__ import annotations

from ...plan.hooks import PlanHooks
from ...plan.spec import Layout, PositionTable, RotaryIndex, TowerShape
from ...rewrite.edits import PLACEHOLDER_MASK, VISION_ATTENTION_WEIGHTS, feature_split
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_generate, make_model_forward, make_vision_forward
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import MODEL_PARAMS, family_module, installed_source_has
from . import boundaries
from .inputs import boundary_ids, build_ovis_inputs

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "build_ovis_inputs", "boundary_ids", "MERGE_VISUAL_FEATURES"]

_P = "Ovis2_5"
_MODELING = family_module("ovis2_5")

# The placeholders and boundary tokens of one kind (``is_video``): the features scattered by the plan's positions
# (masked_scatter's backward reads its count), the boundary count taken from the plan's host input_ids.
MERGE_VISUAL_FEATURES = (
    Edit("expr", "inputs_embeds.masked_scatter(visual_mask, visual_features)",
         '_syncfree.scatter_features(inputs_embeds, visual_mask, visual_features, input_ids, '
         '"video" if is_video else "image")'),
    Edit("stmt", "num_boundary_tokens = boundary_mask.sum()",
         "num_boundary_tokens = _syncfree.token_count(input_ids, boundary_mask, boundary_token_id, "
         "num_visual_inputs)"),
)

# The tower's stock forward, as the wrapper relies on it: every helper pops the plan's value from its kwargs (the
# embeddings from their own copy), and the blocks get the rest (the plan's segment sizes).
_TOWER_NEEDS = ("self.embeddings(pixel_values, grid_thw, **kwargs)", "get_vision_window_index(",
                'kwarg_name="max_window_seqlen"', "get_vision_attention_seqlens(grid_thw, self.config, kwargs=kwargs)",
                "get_vision_position_ids(grid_thw, self.spatial_merge_size, kwargs=kwargs)", "**kwargs,")

_TARGETS = (
    Target(f"{_P}VisionAttention", "forward", edits=VISION_ATTENTION_WEIGHTS),
    Target(f"{_P}VisionModel", "forward", wrap=make_vision_forward, params=("pixel_values", "grid_thw"),
           needs=_TOWER_NEEDS),
    # What the plan's interpolation tables stand for, as the installed source says it.
    Target(f"{_P}VisionEmbeddings", "__init__", check_only=True,
           needs=("self.num_patches_per_side = self.image_size // self.patch_size",
                  "self.num_grid_per_side = int(self.num_positions**0.5)", 'self.interpolation_mode = "bicubic"')),
    Target(f"{_P}VisionEmbeddings", "forward", check_only=True,
           needs=("get_vision_interpolation_indices_and_weights(", "mode=self.interpolation_mode",
                  "spatial_merge_size=self.spatial_merge_size", "kwargs=kwargs")),
    Target(f"{_P}Model", "get_image_features",
           edits=feature_split("self.vision_tower.config.spatial_merge_size", prod="dim=1", kinds=("image",))),
    Target(f"{_P}Model", "get_placeholder_mask", edits=PLACEHOLDER_MASK),
    Target(f"{_P}Model", "_merge_visual_features", edits=MERGE_VISUAL_FEATURES),
    Target(f"{_P}Model", "forward", wrap=make_model_forward, params=MODEL_PARAMS,
           needs=("self._merge_visual_features(", "self.language_model(")),
    Target(f"{_P}ForConditionalGeneration", "generate", wrap=make_generate, inherited=True),
)

# Registered where Transformers ships Ovis2.5 (5.25 on); older releases have none.
FAMILIES: tuple[Family, ...] = () if not installed_source_has(_MODELING, "def _merge_visual_features(") else (
    Family("ovis2_5", _TARGETS,
           Layout(_MODELING, rope=RotaryIndex(mrope=False), token_types=False,
                  table=PositionTable(side="image_size", align_corners_from=f"{_P}VisionEmbeddings", mode="bicubic"),
                  one_graph=True, stream=True,
                  tower=TowerShape(windows=True, holds_projector=False, records_hidden_states=True),
                  plan=PlanHooks(fields=boundaries.boundary_counts, values=boundaries.boundary_values)),
           helpers=boundaries),
)

# A tiny model with the real layout rules: patch 16, merge 2, temporal patch 1, 112-pixel windows (3x3 merged patches:
# larger images get several, some cut by the image's edge), an 8x8 learned table (image_size 128) resampled bicubically,
# window layers around a full one, a visual vocabulary of 60 + 4 indicators; Qwen3's text model.
_OVIS_TINY = dict(
    model_type="ovis2_5", image_token_id=1000, video_token_id=1001, image_start_token_id=1002,
    image_end_token_id=1003, video_start_token_id=1004, video_end_token_id=1005, tie_word_embeddings=False,
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                       patch_size=16, spatial_merge_size=2, temporal_patch_size=1, image_size=128, window_size=112,
                       layer_types=["window_attention", "full_attention", "window_attention"], vocab_size=64,
                       num_visual_indicator_tokens=4),
    text_config=dict(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                     pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
PRESETS: dict[str, Preset] = {
    "ovis2.5-tiny": Preset("ovis2.5-tiny", _OVIS_TINY, 0,
                           "tiny Ovis2.5 for tests (window and full tower layers, bicubic learned table)"),
}
VISION_CLASSES = {"ovis2_5": f"{_P}VisionModel"}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_ovis_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"ovis2_5": "Ovis2.5"})
