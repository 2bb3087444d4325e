"""GLM-5-Next: GLM-OCR's packed tower (verbatim) before a hybrid text model (KDA linear attention, latent attention
with a pooled DSA indexer, MoE experts, hyper-connections) without 3D positions.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* no rotary index: the text model numbers tokens itself and the forward takes no ``mm_token_type_ids`` (the
  EXAONE-4.5 layout), although the processor returns them;
* video frames are written with the image placeholder, and stock tells them apart by the video start/end spans
  around them (``in_video_span``), counting image and video placeholders apart: the plan types tokens the same way
  from input_ids (``VideoLayout.spans``); as in GLM-4.6V, ``get_video_features`` hands the tower one ``(1, h, w)``
  grid row per frame (``video_frames_as_images``);
* the tower calls its blocks without ``**kwargs`` (``BLOCK_KWARGS``, as GLM-OCR's);
* the pooled DSA indexer keeps its usable pools with a boolean select: by the plan's host mask where that shows
  they are a prefix (``POOLED_WRITTEN`` / ``POOLED_KEEP`` in ``edits.py``, with the family's own helpers in
  ``pooled_keep.py``); its KDA layers' all-ones mask check is the shared ``create_recurrent_attention_mask`` target;
* in a traced forward (``Layout.one_graph``), the indexer keeps the prefix the plan measured on its host mask when it
  was built (``pooled_keep.kept_counts``), and ``get_video_features``' per-frame grid is sized and made known as
  GLM-4.6V's (``glm.FRAME_GRID``); in a stream's (``Layout.stream``), that prefix is a size of the graph, the pooling
  one operator (``pooled_keep.pooled_states``), the pool budget a symbolic ``min`` (``POOL_BUDGET``) and the KDA
  layers' chunked delta rule one operator as Qwen3.5's (``KDA_CHUNKS``);
* a video frame is ``<|begin_of_image|>``, its placeholders, ``<|end_of_image|>`` and ``{seconds:.1f} seconds``,
  inside ``<|begin_of_video|>``..``<|end_of_video|>``; an image is its placeholders between the image markers.
"""

from __future__ import annotations

import torch

from ...items import Video
from ...plan.hooks import PlanHooks
from ...plan.spec import Layout, RotaryIndex, VideoLayout
from ...rewrite.edits import BLOCK_KWARGS, FEATURE_SPLIT
from ...rewrite.targets import Family, Target
from ..glm import FRAME_GRID, FRAME_GRID_HELPERS, build_glm_inputs
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import (
    family_module,
    installed_source_has,
    vlm_targets,
)
from . import pooled_keep
from .edits import KDA_CHUNKS, POOL_BUDGET, POOLED_KEEP, POOLED_WRITTEN

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "build_glm5next_inputs"]

_P = "Glm5Next"


def _glm5_next() -> Family:
    targets = vlm_targets(f"{_P}VisionAttention", f"{_P}VisionModel", f"{_P}Model", f"{_P}ForConditionalGeneration",
                          rope_needs=None, vision_edits=BLOCK_KWARGS, feature_split=FEATURE_SPLIT + FRAME_GRID)
    targets += (
        Target(f"{_P}TextIndexer", "forward", edits=POOLED_WRITTEN + POOL_BUDGET),
        Target(f"{_P}TextIndexer", "get_pooled_states", edits=POOLED_KEEP),
        Target(f"{_P}TextLinearAttention", "forward", edits=KDA_CHUNKS),
    )
    layout = Layout(family_module("glm5_next"), rope=RotaryIndex(mrope=False), one_graph=True, stream=True,
                    video=VideoLayout(frames_as_runs=True, frames_as_images=True, spans=True),
                    plan=PlanHooks(fields=pooled_keep.kept_counts, values=pooled_keep.kpool_value,
                                   sizes=(pooled_keep.KEPT,)))
    helpers = {**{name: getattr(pooled_keep, name) for name in pooled_keep.__all__}, **FRAME_GRID_HELPERS}
    return Family("glm5_next", targets, layout, helpers=helpers)


# Registered where the installed GLM-5-Next has the indexed-attention layers its pooled-indexer edits stand for
# (Transformers 5.24; 5.17 has other DSA code: left stock there).
FAMILIES: tuple[Family, ...] = ((_glm5_next(),) if installed_source_has(family_module("glm5_next"), "indexed_attention")
                                else ())

# A tiny model with the real layout rules: patch 14, temporal patch 2, merge 2; a text model of two KDA and two
# indexed (latent, NoPE) layers, dense and MoE MLPs (4 experts, 2 per token), 2 hyper-connection streams, and an
# indexer with pools of 4 keys and a budget of 2 pools (so test sequences select: they are longer than 8 tokens).
_GLM5_NEXT_TINY = dict(
    model_type="glm5_next", image_token_id=1000, video_token_id=1001, image_start_token_id=1002,
    image_end_token_id=1003, video_start_token_id=1004, video_end_token_id=1005,
    vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       projection_intermediate_size=96, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                       image_size=112),
    text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                     num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=0,
                     qk_nope_head_dim=16, v_head_dim=16, index_topk=8, index_head_dim=16, index_n_heads=2,
                     index_kpool=4, linear_head_dim=16, linear_num_heads=2, linear_conv_kernel_dim=4, hc_mult=2,
                     mlp_layer_types=["dense", "sparse", "dense", "sparse"],
                     layer_types=["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"],
                     max_position_embeddings=4096, pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
PRESETS: dict[str, Preset] = {
    "glm5-next-tiny": Preset("glm5-next-tiny", _GLM5_NEXT_TINY, 0,
                             "tiny GLM-5-Next for tests (KDA and pooled-indexer layers, MoE, span-typed video)"),
}
VISION_CLASSES = {"glm5_next": f"{_P}VisionModel"}


def glm5next_stamp_tokens(video: Video, t: int, temporal_patch: int) -> list[int]:
    """The text tokens of each temporal patch's ``{seconds:.1f} seconds``: a token per character of the number and one
    for " seconds" (a stand-in tokenizer). The processor's times: every second sampled frame's, the first ``t`` of
    them (the last repeated)."""
    stamps = [i / video.fps for i in range(video.frames)][::2][:t]
    stamps += [stamps[-1] if stamps else 0.0] * (t - len(stamps))
    return [len(f"{stamp:.1f}") + 1 for stamp in stamps]


def build_glm5next_inputs(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                          pad_token_id: int | None = None) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``Glm5NextProcessor`` (and its chat template) lays them out: GLM-4.1V's layout (an image is
    begin-of-image, its placeholders, end-of-image; a video frame the same inside begin/end-of-video) with its own
    timestamps after each frame, ``{t:.1f} seconds``."""
    return build_glm_inputs(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id,
                            stamp_tokens=glm5next_stamp_tokens)


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_glm5_next(config) -> None:
    # Its head_dim is the rotary part of its latent attention's heads (derived once, in __post_init__).
    config.text_config.head_dim = config.text_config.qk_rope_head_dim


CENSUS_FIXES = {"glm5_next": _census_fix_glm5_next}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_glm5next_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    census_fixes=CENSUS_FIXES, display={"glm5_next": "GLM-5-Next"})
