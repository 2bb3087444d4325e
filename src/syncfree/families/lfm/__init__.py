"""LFM3-VL: a Qwen-style packed tower with gated short-convolution layers, whose projector merges patches after the
tower, before LFM3's hybrid (convolution + attention) text model, without 3D positions.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* no rotary index: the text model numbers tokens itself and the processor returns no ``mm_token_type_ids`` (the
  EXAONE-4.5 layout: the plan computes no positions, counts placeholders);
* the tower is ``vision_tower``, takes ``pixel_values`` and reads ``grid_thw.tolist()`` for its convolutions' per-frame
  reshapes: no sync with the plan's host grid, which the wrapper hands it; in a traced forward of a stream the
  convolutions' per-frame loop is one operator over that host grid (``conv``): one graph for any layout;
* its attention loop passes its own mask argument and collects each segment's weights
  (``VISION_ATTENTION_WEIGHTS_MASKED``); the forward names its features ``image_features`` / ``video_features``
  (``FEATURE_SCATTER_FEATURES``);
* the projector sits outside the tower (``vision_every_step`` is refused);
* a video frame is its timestamp in text, then the vision start id, the frame's placeholders and the end id (Qwen3-VL's
  processor layout).
"""

from __future__ import annotations

from ...plan.spec import Layout, RotaryIndex, TowerShape, VideoLayout
from ...rewrite.edits import FEATURE_SCATTER_FEATURES, GRID_LIST, VISION_ATTENTION_WEIGHTS_MASKED, feature_split
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..qwen_vl.inputs import build_inputs
from ..shared import family_module, vlm_targets
from . import conv

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP"]

# In a traced stream forward the tower's grid list is the plan's host grid, and the convolution's per-frame loop one
# operator over it (``conv``).
_CONV = (
    Edit("stmt", """
         for frames, (temporal, height, width) in zip(torch.split(gated, lengths, dim=0), grid_thw):
             frames = frames.view(temporal, height // merge, width // merge, merge, merge, channels)
             frames = frames.permute(0, 5, 1, 3, 2, 4).reshape(temporal, channels, height, width)
             frames = self.spatial_conv(frames)
             frames = frames.view(temporal, channels, height // merge, merge, width // merge, merge)
             conv_outputs.append(frames.permute(0, 2, 4, 3, 5, 1).reshape(temporal * height * width, channels))""",
         """
         if _syncfree.convolves_in_one(grid_thw):
             conv_outputs.append(_syncfree.frame_convs(self.spatial_conv, gated, grid_thw, merge))
         else:
             for frames, (temporal, height, width) in zip(torch.split(gated, lengths, dim=0), grid_thw):
                 frames = frames.view(temporal, height // merge, width // merge, merge, merge, channels)
                 frames = frames.permute(0, 5, 1, 3, 2, 4).reshape(temporal, channels, height, width)
                 frames = self.spatial_conv(frames)
                 frames = frames.view(temporal, channels, height // merge, merge, width // merge, merge)
                 conv_outputs.append(frames.permute(0, 2, 4, 3, 5, 1).reshape(temporal * height * width, channels))"""),
    Edit("expr", "[temporal * height * width for temporal, height, width in grid_thw]",
         "None if _syncfree.convolves_in_one(grid_thw) else "
         "[temporal * height * width for temporal, height, width in grid_thw]"),
)
_TARGETS = vlm_targets("Lfm3VlVisionAttention", "Lfm3VlVisionModel", "Lfm3VlModel",
                                  "Lfm3VlForConditionalGeneration", rope_needs=None,
                                  attention_edits=VISION_ATTENTION_WEIGHTS_MASKED, scatter=FEATURE_SCATTER_FEATURES,
                                  vision_params=("pixel_values", "grid_thw"), vision_needs=("grid_thw.tolist()",),
                                  vision_edits=GRID_LIST,
                                  feature_split=feature_split("self.vision_tower.spatial_merge_size", kinds=("image",)))
_TARGETS += (Target("Lfm3VlVisionShortConv", "forward", edits=_CONV),)

FAMILIES: tuple[Family, ...] = (
    Family("lfm3_vl", _TARGETS,
           Layout(family_module("lfm3_vl"), video=VideoLayout(frames_as_runs=True), rope=RotaryIndex(mrope=False),
                  token_types=False, tower=TowerShape(holds_projector=False), one_graph=True, stream=True),
           helpers=conv),
)

# A tiny model with the real layout rules: patch 16, temporal patch 2, merge 2 (in the projector), a convolution
# layer and an attention layer in the tower and in the text model (its sliding and proportional rope kinds).
_LFM3_TINY = dict(
    model_type="lfm3_vl", image_token_id=1000, video_token_id=1001, vision_start_token_id=1002,
    vision_end_token_id=1003, projector_hidden_size=64,
    vision_config=dict(hidden_size=32, intermediate_size=64, in_channels=3, patch_size=16, spatial_merge_size=2,
                       temporal_patch_size=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       layer_types=["conv", "full_attention"], conv_kernel_size=3),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                     layer_types=["conv", "full_attention"], sliding_window=256,
                     rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                                      "full_attention": dict(rope_type="proportional", rope_theta=1000000.0,
                                                             partial_rotary_factor=0.5)},
                     pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
PRESETS: dict[str, Preset] = {
    "lfm3-vl-tiny": Preset("lfm3-vl-tiny", _LFM3_TINY, 0, "tiny LFM3-VL for tests (convolution and attention layers)"),
}
VISION_CLASSES = {"lfm3_vl": "Lfm3VlVisionModel"}


# The group, as the registry reads it (``families.GROUPS``).
# Its batches: Qwen3-VL's layout without ``mm_token_type_ids`` (as ``Lfm3VlProcessor`` returns it).
GROUP = FamilyGroup(FAMILIES, build_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"lfm3_vl": "LFM3-VL"})
