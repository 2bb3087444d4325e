"""Cosmos3-Edge: a SigLIP2-style packed vision tower (no rotary ids; its own antialiased resampling of a learned
position table per grid row), Qwen2-VL's attention split, and Qwen3-VL's rotary index (one run per frame).

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* the tower (``Cosmos3EdgeVisionModel.forward(pixel_values, grid_thw)``) leaves the attention's ``cu_seqlens`` to
  its encoder's stock helper, and hands every other keyword on to the attention function: the wrapper passes only
  the segment sizes (``make_vision_forward_seqlens_only``), never rotary ids, which flash attention would read;
* its position resampling (a ``staticmethod``) loops over ``grid_thw.tolist()``: with the plan's host grid that is no
  read; in a traced forward the plan's rows (``GRID_LIST``), or in a traced forward of a stream the stock function in
  one operator over the plan's host grid (``positions``): one graph for any layout;
* the attention concatenates its per-segment calls in one statement (``VISION_ATTENTION_CAT``);
* pixels are ``(patches, channels * patch * patch)``, one frame per temporal step (no temporal patch);
* packed batches only where its text model takes 4-row positions (``_packing``).
"""

from __future__ import annotations

from ...plan.spec import Layout, TowerShape, VideoLayout
from ...rewrite.edits import GRID_LIST, VISION_ATTENTION_CAT, feature_split
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_vision_forward_seqlens_only
from ..group import FamilyGroup
from ..preset import Preset
from ..qwen_vl.inputs import build_inputs
from ..shared import PACKS, family_module, installed_source_has, vlm_targets
from . import positions

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP"]

_MODELING = family_module("cosmos3_edge")


def _packing() -> dict:
    """Packed batches where the installed text model (``Cosmos3EdgeTextModel.forward``) takes 4-row positions, the
    text row first: it splits that row off for its masks, where the patched forward hands the samples' boundaries.
    An older one (Transformers 5.17's) takes 3 rows only (its rotary embedding fails on 4, and its masks read the
    temporal row): refused there, in one line. Read from the installed source, as the family's registration is."""
    if installed_source_has(_MODELING, "position_ids.shape[0] == 4", "position_ids = position_ids[1:]"):
        return PACKS
    return dict(packing_refused="this Transformers release's text model (Cosmos3EdgeTextModel) takes 3-row "
                                "position_ids only, without the text row that carries the packed samples' boundaries "
                                "to its masks (Transformers 5.25's takes 4 rows)")


def _cosmos() -> Family:
    targets = vlm_targets(
        "Cosmos3EdgeVisionAttention", "Cosmos3EdgeVisionModel", "Cosmos3EdgeModel",
        "Cosmos3EdgeForConditionalGeneration", rope_needs=("video_grid_thw[:, 0] = 1",),
        attention_edits=VISION_ATTENTION_CAT, vision_wrap=make_vision_forward_seqlens_only,
        vision_params=("pixel_values", "grid_thw"),
        base_vision_needs=("self.encoder(hidden_states, grid_thw=grid_thw, **kwargs)",),
        feature_split=feature_split("self.projector.spatial_merge_size", kinds=("image",)))
    # What the wrapper relies on beyond the tower's own code: the encoder takes the planned cu_seqlens from its
    # kwargs, and the position resampling reads the grid on the host (the wrapper hands it the host grid).
    targets += (Target("Cosmos3EdgeEncoder", "forward", check_only=True,
                       needs=("get_vision_attention_seqlens(grid_thw, self.config, kwargs=kwargs)", "**kwargs,")),
                Target("Cosmos3EdgeVisionEmbeddings", "resize_positional_embeddings", edits=GRID_LIST,
                       needs=("for temporal, height, width in grid_thw.tolist():",)),
                Target("Cosmos3EdgeVisionEmbeddings", "forward", edits=(Edit(
                    "expr", "self.resize_positional_embeddings(positional_embeddings, grid_thw, "
                            "self.config.spatial_merge_size)",
                    "_syncfree.resized_positions(self.resize_positional_embeddings, positional_embeddings, grid_thw, "
                    "self.config.spatial_merge_size, patch_embeds)"),)))
    return Family("cosmos3_edge", targets, Layout(_MODELING, video=VideoLayout(frames_as_runs=True),
                                                  tower=TowerShape(holds_projector=False), one_graph=True, stream=True,
                                                  **_packing()), helpers=positions)


FAMILIES: tuple[Family, ...] = (_cosmos(),)

# A tiny model with the real layout rules: patch 16, merge 2, a learned 4x4 position table (num_patches 16)
# resampled to every grid row, one frame per temporal step, Qwen3-VL-style M-RoPE.
_COSMOS_TINY = dict(
    model_type="cosmos3_edge", image_token_id=1000, video_token_id=1001, vision_start_token_id=1002,
    vision_end_token_id=1003, projector_hidden_size=64,
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_channels=3, patch_size=16, num_patches=16, spatial_merge_size=2),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                     rope_parameters=dict(rope_type="default", rope_theta=5_000_000, mrope_section=[2, 3, 3])),
)
# nvidia/Cosmos3-Edge: Transformers' config defaults (its published processor config agrees: patch 16, merge 2, one
# frame per temporal step); a SigLIP2 tower of 27 blocks of 1152 and a 16x16 learned table, a relu2 text model.
_COSMOS = dict(
    model_type="cosmos3_edge", tie_word_embeddings=False, image_token_id=19, video_token_id=18,
    vision_start_token_id=20, vision_end_token_id=21, projector_hidden_size=11520,
    vision_config=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                       num_channels=3, patch_size=16, num_patches=256, spatial_merge_size=2,
                       hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6),
    text_config=dict(vocab_size=131072, hidden_size=2048, intermediate_size=9216, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="relu2",
                     max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False,
                     rope_parameters=dict(rope_type="default", rope_theta=1e8, mrope_section=[24, 20, 20]),
                     bos_token_id=1, eos_token_id=11),
)
PRESETS: dict[str, Preset] = {
    "cosmos3-edge": Preset("cosmos3-edge", _COSMOS, 0, "Cosmos3-Edge (published shapes, Transformers' defaults)"),
    "cosmos3-edge-tiny": Preset("cosmos3-edge-tiny", _COSMOS_TINY, 0, "tiny Cosmos3-Edge for tests"),
}
VISION_CLASSES = {"cosmos3_edge": "Cosmos3EdgeVisionModel"}


# The group, as the registry reads it (``families.GROUPS``).
# Its batches: Qwen3-VL's layout (markers around each image; per frame a timestamp, then its marked placeholders), with
# Cosmos's pixels: ``Cosmos3EdgeProcessor`` writes videos so, and its chat template marks images so.
GROUP = FamilyGroup(FAMILIES, build_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"cosmos3_edge": "Cosmos3-Edge"})
