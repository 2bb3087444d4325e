"""The Qwen-VL families: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5, Qwen3.5-MoE.

Everything syncfree knows of them: what it patches in each (``FAMILIES``: the targets and the input
layout), how their processors lay a batch out (``inputs``), and their presets (``presets``). They differ
only in class names and in which of the shared pieces they have (Qwen3-VL's deepstack and learned
positions; Qwen2.5-VL's windows and video time scale).
"""

from __future__ import annotations

from ...plan.spec import Layout, ModelSpec, PositionTable, TowerShape, VideoLayout
from ...rewrite.edits import CHUNK_DELTA_RULE, DEEPSTACK_MERGE, DEEPSTACK_PROCESS
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_per_sample_recurrent
from ..group import FamilyGroup
from ..shared import PACKS, WINDOW_NEEDS, family_module, vlm_targets
from .inputs import build_inputs
from .presets import PRESETS, VISION_CLASSES

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "qwen3_vl_targets", "QWEN3_LAYOUT", "ASSUMED_SPEC"]


def _common(attention: str, vision: str, prefix: str, vision_needs: tuple, rope_needs: tuple,
            model_edits: tuple = ()) -> tuple[Target, ...]:
    return vlm_targets(attention, vision, f"{prefix}Model", f"{prefix}ForConditionalGeneration",
                       vision_needs=vision_needs, rope_needs=rope_needs, model_edits=model_edits)


def qwen3_vl_targets(prefix: str, deepstack: bool = True, recurrent: bool = False) -> tuple[Target, ...]:
    """Qwen3-VL's vision tower and layout; Qwen3.5 has the same without the deepstack features, and gated-DeltaNet
    layers (``recurrent``: run sample by sample in a packed batch, their chunked delta rule one operator in a traced
    stream forward)."""
    targets = _common(f"{prefix}VisionAttention", f"{prefix}VisionModel", prefix,
                      vision_needs=("get_vision_interpolation_indices_and_weights(",),
                      rope_needs=("video_grid_thw[:, 0] = 1",), model_edits=DEEPSTACK_MERGE if deepstack else ())
    if deepstack:
        targets += (Target(f"{prefix}TextModel", "_deepstack_process", edits=DEEPSTACK_PROCESS),)
    if recurrent:
        # (and its chunked delta rule one operator in a traced stream forward: stock's loop over chunks made a graph
        # per chunk count)
        targets += (Target(f"{prefix}GatedDeltaNet", "forward", wrap=make_per_sample_recurrent, edits=CHUNK_DELTA_RULE,
                           # (its cache is ``cache`` from Transformers 5.25, ``cache_params`` before: either)
                           params=("hidden_states", "attention_mask"),
                           needs=("recurrent_state",), borrowed=True),)
    return targets


def _family(model_type: str, targets: tuple[Target, ...], **traits) -> Family:
    return Family(model_type, targets, Layout(family_module(model_type), **traits))


QWEN3_LAYOUT = dict(table=PositionTable(), video=VideoLayout(frames_as_runs=True))
# (every family here traces whole, and one graph serves a stream of layouts: Layout.one_graph, Layout.stream)
ONE_GRAPH = dict(one_graph=True, stream=True)
# (Qwen3.5's gated-DeltaNet layers: Transformers resets their state per sample only in flash-linear-attention's kernels
# (cu_seqlens), which have no CPU build, and its convolution spans the samples' joins (no seq_idx). In a packed batch
# the patched layer runs each sample alone instead: ``make_per_sample_recurrent``.)

FAMILIES: tuple[Family, ...] = (
    _family("qwen3_vl", qwen3_vl_targets("Qwen3VL"), **QWEN3_LAYOUT, **ONE_GRAPH, **PACKS),
    _family("qwen3_vl_moe", qwen3_vl_targets("Qwen3VLMoe"), **QWEN3_LAYOUT, **ONE_GRAPH, **PACKS),
    _family("qwen3_5", qwen3_vl_targets("Qwen3_5", deepstack=False, recurrent=True), **QWEN3_LAYOUT, **ONE_GRAPH,
            **PACKS),
    _family("qwen3_5_moe", qwen3_vl_targets("Qwen3_5Moe", deepstack=False, recurrent=True), **QWEN3_LAYOUT,
            **ONE_GRAPH, **PACKS),
    _family("qwen2_vl", _common("VisionAttention", "Qwen2VisionTransformerPretrainedModel", "Qwen2VL",
                                vision_needs=(), rope_needs=()), **ONE_GRAPH, **PACKS),
    _family("qwen2_5_vl", _common("Qwen2_5_VLVisionAttention", "Qwen2_5_VisionTransformerPretrainedModel", "Qwen2_5_VL",
                                  vision_needs=WINDOW_NEEDS,
                                  rope_needs=("tokens_per_second * ",)),
            tower=TowerShape(windows=True), video=VideoLayout(time_scale=True), **ONE_GRAPH, **PACKS),
)


def _published_spec(values: dict) -> ModelSpec:
    """The plan's values of a published config: merge, position table side and placeholder token ids."""
    vision, model_type = values["vision_config"], values["model_type"]
    return ModelSpec(model_type, vision["spatial_merge_size"], int(vision["num_position_embeddings"] ** 0.5),
                     values["image_token_id"], values["video_token_id"], family_module(model_type),
                     table=QWEN3_LAYOUT["table"], video=QWEN3_LAYOUT["video"])


# What ``prepare(batch)`` assumes without a model (registered by ``syncfree.families``): the published Qwen3-VL
# checkpoints' values, which they all share; the forward checks them against the model.
ASSUMED_SPEC = _published_spec(PRESETS["qwen3-vl-2b"].values)


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_inputs, presets=PRESETS, vision_classes=VISION_CLASSES, assumed_spec=ASSUMED_SPEC,
                    display={"qwen2_vl": "Qwen2-VL", "qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL",
                             "qwen3_vl_moe": "Qwen3-VL-MoE", "qwen3_5": "Qwen3.5", "qwen3_5_moe": "Qwen3.5-MoE"})
