"""LLaVA-OneVision-1.5: RiceViT (a packed tower with 2D axial rotary ids that prepends a class token to every frame)
and Qwen3's text model, without 3D positions.

What is its own, beside the Qwen-VL pieces ``vlm_targets`` declares:

* the tower prepends a learned class token to each frame (each attention segment) after its patch embedding, shifts
  ``cu_seqlens`` by one per segment and ``max_seqlen`` by one, and drops the class tokens before its merger; it splits
  frames by ``get_vision_frame_lengths`` (stock: ``repeat_interleave(...).tolist()``, two reads). The plan hands that
  helper its host per-frame patch counts (``frame_lengths``) and the attention its segments one token longer
  (``TowerShape.segment_class_token``); stock's own code shifts the device ``cu_seqlens`` (no read); in a traced forward
  of a stream the frame lengths are a host tensor and the class tokens' per-frame loops one operator each
  (``class_tokens``), the layers' shifted ``cu_seqlens`` the plan's one segmentation: one graph for any layout;
* no rotary index: the text model numbers tokens 0..S-1 itself (the multimodal forward builds 1D positions, and
  ``_prepare_position_ids_for_generation`` is stock's default), and the processor returns no ``mm_token_type_ids``
  (the EXAONE-4.5 layout: the plan computes no positions, counts placeholders);
* the processor is EXAONE-4.5's (``Exaone4_5_Processor``) over Qwen2-VL's image and video processors with one frame
  per temporal step (the vision config names no ``temporal_patch_size``; its Conv2d embeds each 14x14 patch): an image
  is ``h*w/4`` placeholders, a video ``t*h*w/4`` in one run; its Qwen2-VL-style chat template writes the config's
  vision start and end ids around each (text tokens here: no 3D positions read them).

Registered only where Transformers ships this code (5.25): older releases have no such model.
"""

from __future__ import annotations

from ...plan.spec import Layout, RotaryIndex, TowerShape
from ...rewrite.rewriter import Edit
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..qwen_vl.inputs import build_inputs
from ..shared import (
    VISION_NEEDS,
    family_module,
    installed_source_has,
    vlm_targets,
)
from . import class_tokens

__all__ = ["FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP"]

_MODELING = family_module("llava_onevision1_5")
_P = "LlavaOnevision15"

# The tower's stock forward, as the plan's values stand for it: the frame lengths popped from kwargs, the class token
# per frame (its segments and max_seqlen shifted by one), the frames split by those host lengths.
_VISION_NEEDS = ("get_vision_frame_lengths(grid_thw, kwargs=kwargs)",
                 "cu_seqlens = cu_seqlens + torch.arange(cu_seqlens.shape[0], device=cu_seqlens.device,",
                 "max_seqlen += 1", "self.cls_embeddings(hidden_states, cos, sin, frame_lengths)",
                 "[length + 1 for length in frame_lengths]")
# In a traced stream forward the frame lengths are a host tensor (``VisionPlan.vision_kwargs``): the class tokens' loops
# over the frames run as one operator each over it (``class_tokens``).
_DROPPED = Edit("expr", "torch.cat([frame[1:] for frame in torch.split(hidden_states, [length + 1 for length in "
                        "frame_lengths])], dim=0)", "_syncfree.class_tokens_dropped(hidden_states, frame_lengths)")
_PREPENDED = Edit("expr", "torch.cat([torch.cat((cls_states, frame)) for frame in hidden_states.split(frame_lengths)])",
                  "_syncfree.class_tokens_prepended(hidden_states, cls_states, frame_lengths)")
_TARGETS = vlm_targets(f"{_P}VisionAttention", f"{_P}VisionModel", f"{_P}Model", f"{_P}ForConditionalGeneration",
                       rope_needs=None, vision_params=("pixel_values", "grid_thw"),
                       base_vision_needs=tuple(n for n in VISION_NEEDS if n != "**kwargs,") + _VISION_NEEDS,
                       vision_edits=(_DROPPED,))
_TARGETS += (Target(f"{_P}VisionClassEmbeddings", "prepend_cls", edits=(_PREPENDED,)),)


def _written_for() -> bool:
    """Whether the installed LLaVA-OneVision-1.5 is the code this family was written for (Transformers 5.25's: the
    frame-length helper that takes the plan's lengths from kwargs). Read from the file: nothing imported."""
    return installed_source_has(_MODELING, "def get_vision_frame_lengths(", 'kwargs.pop("frame_lengths", None)')


FAMILIES: tuple[Family, ...] = () if not _written_for() else (
    Family("llava_onevision1_5", _TARGETS,
           Layout(_MODELING, rope=RotaryIndex(mrope=False), token_types=False,
                  tower=TowerShape(segment_class_token=True), one_graph=True, stream=True),
           helpers=class_tokens),
)

# A tiny model with the real layout rules: patch 14, merge 2, no temporal patches, a class token per frame, axial
# rotary ids on a vision head of 16 (hidden 32 over 2 heads: a multiple of 4 heads, as the config requires); Qwen3's
# text model with grouped-query attention.
_LLAVA_OV15_TINY = dict(
    model_type="llava_onevision1_5", image_token_id=1000, video_token_id=1001, vision_start_token_id=1002,
    vision_end_token_id=1003, tie_word_embeddings=False,
    vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       hidden_act="gelu", in_channels=3, patch_size=14, spatial_merge_size=2,
                       rope_parameters=dict(rope_type="axial", rope_theta=10000.0)),
    text_config=dict(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                     rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                     pad_token_id=0, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False),
)
PRESETS: dict[str, Preset] = {
    "llava-ov-1.5-tiny": Preset("llava-ov-1.5-tiny", _LLAVA_OV15_TINY, 0,
                                "tiny LLaVA-OneVision-1.5 for tests (a class token per frame, Qwen3 text)"),
}
VISION_CLASSES = {"llava_onevision1_5": f"{_P}VisionModel"}


# The group, as the registry reads it (``families.GROUPS``).
# Its batches: The config's vision start and end ids around each image's or video's placeholders (one run per video), no
# ``mm_token_type_ids``, pixels of one frame per patch.
GROUP = FamilyGroup(FAMILIES, build_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    display={"llava_onevision1_5": "LLaVA-OneVision-1.5"})
