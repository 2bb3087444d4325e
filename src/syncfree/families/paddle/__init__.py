"""PaddleOCR-VL: an image-only model with a SigLIP-style packed tower that merges patches only after its encoder
(in the projector), and Qwen2-VL's rotary index.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* the tower's helpers take merge 1 (rotary ids are plain (row, col)) and its learned 27x27 table (image_size //
  patch_size on a side) is resampled as its embeddings say (``align_corners=False`` since 5.2x, True in 5.17, read
  from the installed code): the plan's tables are made so (``TowerShape.encoder_merge``, the
  ``PositionTable``'s ``align_corners_from`` and ``side``);
* the helpers live in nested modules (``PaddleOCRVisionModel`` -> ``...Transformer`` -> ``...Embeddings`` /
  ``...Encoder``): the wrapper sits on the outer tower, and check-only targets pin the code it relies on;
* ``get_image_features`` calls the tower by keyword (``pixel_values=``), with pixels (1, patches, C, P, P);
* the attention collects each segment's weights in its loop (``VISION_ATTENTION_WEIGHTS``);
* no video: the image lines of the placeholder and scatter edits only;
* its projector splits the features by patches per image (``grid_products``) and loops over the grid rows, and its
  feature split spells the merge through the config: all from the plan's rows where a traced forward cannot read them;
  in a traced forward of a stream the loop runs once over all images in block order (``projector``), its linear
  layers one call per image in one operator: one graph for any images (``Layout.stream``).
"""

from __future__ import annotations

from ...items import Video
from ...plan.errors import InputsNotTaken
from ...plan.hooks import PlanHooks
from ...plan.spec import Layout, PositionTable, TowerShape
from ...rewrite.edits import VISION_ATTENTION_WEIGHTS
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..qwen_vl.inputs import build_inputs
from ..shared import PACKS, family_module, vlm_targets
from . import projector

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP"]


# (For a traced forward: the feature split reads the merge from the config, and the projector splits by patches.)
_FEATURE_SPLIT = (
    Edit("expr", "(image_grid_thw.prod(-1) // self.config.vision_config.spatial_merge_size**2).tolist()",
         "_syncfree.feature_split_sizes(image_grid_thw, self.config.vision_config.spatial_merge_size)"),
)
_PROJECTOR_SPLIT = (
    Edit("expr", "image_features.split(image_grid_thw.prod(dim=1).tolist(), dim=0)",
         "_syncfree.block_chunks(image_features, image_grid_thw, self.merge_kernel_size) "
         "or image_features.split(_syncfree.grid_products(image_grid_thw), dim=0)"),
    Edit("expr", "zip(image_features_chunks, image_grid_thw)",
         "zip(image_features_chunks, _syncfree.block_rows(image_grid_thw, image_features_chunks, "
         "self.merge_kernel_size) or _syncfree.grid_rows(image_grid_thw))"),
    Edit("expr", "self.linear_1(image_feature)",
         "_syncfree.item_linear(self.linear_1, image_feature, image_grid_thw, self.merge_kernel_size)"),
    Edit("expr", "self.linear_2(hidden_states)",
         "_syncfree.item_linear(self.linear_2, hidden_states, image_grid_thw, self.merge_kernel_size)"),
)


def _paddle() -> Family:
    targets = vlm_targets(
        "PaddleOCRVisionAttention", "PaddleOCRVisionModel", "PaddleOCRVLModel", "PaddleOCRVLForConditionalGeneration",
        attention_edits=VISION_ATTENTION_WEIGHTS, vision_params=("pixel_values", "grid_thw"),
        base_vision_needs=("self.vision_model(pixel_values=pixel_values, grid_thw=grid_thw, **kwargs)",),
        image_only=True, feature_split=_FEATURE_SPLIT)
    targets += (
        Target("PaddleOCRProjector", "forward", edits=_PROJECTOR_SPLIT),
        Target("PaddleOCRVisionTransformer", "forward", check_only=True,
               needs=("self.embeddings(pixel_values, grid_thw=grid_thw, **kwargs)", "grid_thw=grid_thw,")),
        Target("PaddleOCRVisionEmbeddings", "forward", check_only=True,
               needs=("get_vision_interpolation_indices_and_weights(", "spatial_merge_size=1", "kwargs=kwargs",
                      "align_corners=self.interpolation_align_corners")),
        Target("PaddleOCRVisionEncoder", "forward", check_only=True,
               needs=("get_vision_position_ids(grid_thw, 1, kwargs=kwargs)",
                      "get_vision_attention_seqlens(grid_thw, self.config, kwargs=kwargs)")),
    )
    # (Its resampling mode is read from the installed code: align_corners was True in 5.17, False since.)
    layout = Layout(family_module("paddleocr_vl"),
                    table=PositionTable(side="image_size", align_corners_from="PaddleOCRVisionEmbeddings"),
                    tower=TowerShape(encoder_merge=1, pixels_4d=True, holds_projector=False), one_graph=True, stream=True,
                    **PACKS,
                    plan=PlanHooks(feature_words=_feature_words, values=_text_width))
    return Family("paddleocr_vl", targets, layout, helpers=projector)


def _text_width(config) -> dict:
    return {"text_hidden_size": config.text_config.hidden_size}


def _feature_words(kind: str, tokens: int, features: int, spec) -> str:
    # Stock's words where image placeholders and features disagree: the count it prints for the features is their
    # elements (features x the text model's width), as its get_placeholder_mask computes it.
    return (f"Image features and image tokens do not match: tokens: {tokens}, "
            f"features {features * spec.value('text_hidden_size')}")


FAMILIES: tuple[Family, ...] = (_paddle(),)

# A tiny model with the real layout rules: patch 14, merge 2 in the projector, a learned 4x4 table (image_size 56)
# resampled to every image with align_corners=False.
_PADDLE_TINY = dict(
    model_type="paddleocr_vl", image_token_id=1000, video_token_id=1001, vision_start_token_id=1002,
    vision_end_token_id=1003,
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_channels=3, image_size=56, patch_size=14, spatial_merge_size=2),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                     rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=[2, 3, 3]),
                     pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
# PaddlePaddle/PaddleOCR-VL (0.9B): the text model and token ids as published; the tower's values from the
# published remote-code config's consumers (its config.json copies we could read stop inside vision_config).
_PADDLE = dict(
    model_type="paddleocr_vl", tie_word_embeddings=False, image_token_id=100295, video_token_id=101307,
    vision_start_token_id=101305, vision_end_token_id=101306,
    vision_config=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                       num_channels=3, image_size=384, patch_size=14, spatial_merge_size=2, layer_norm_eps=1e-6,
                       hidden_act="gelu_pytorch_tanh"),
    text_config=dict(vocab_size=103424, hidden_size=1024, intermediate_size=3072, num_hidden_layers=18,
                     num_attention_heads=16, num_key_value_heads=2, head_dim=128, hidden_act="silu",
                     rms_norm_eps=1e-5, max_position_embeddings=131072, use_bias=False,
                     rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=[16, 24, 24])),
)
PRESETS: dict[str, Preset] = {
    "paddleocr-vl": Preset("paddleocr-vl", _PADDLE, 0, "PaddleOCR-VL 0.9B (published shapes)"),
    "paddleocr-vl-tiny": Preset("paddleocr-vl-tiny", _PADDLE_TINY, 0, "tiny PaddleOCR-VL for tests (images only)"),
}
VISION_CLASSES = {"paddleocr_vl": "PaddleOCRVisionModel"}


def processor_batch(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                    pad_token_id: int | None = None) -> dict:
    """Markers around each image's placeholders, pixels (patches, C, P, P): as the processor and chat template
    lay them out. Images only."""
    if any(isinstance(item, Video) for sample in samples for item in sample):
        raise InputsNotTaken("paddleocr_vl takes images only (its forward has no video inputs)")
    return build_inputs(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id)


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, processor_batch, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"paddleocr_vl": "PaddleOCR-VL"})
