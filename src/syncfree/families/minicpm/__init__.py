"""MiniCPM-OCR, MiniCPM-V 4.6 and 4.7 (the same tower, merger, placeholder and scatter code): a SigLIP-style NaViT
tower whose crops come as ``(h, w)`` rows of ``target_sizes`` (no ``grid_thw``), an optional in-tower window merger,
a per-crop merger after the tower, and Qwen3.5's text model (with 3D positions only in 4.7).

What is its own, beside the Qwen-VL pieces:

* NaViT packing (``Layout.target_sizes``): all crops side by side in one ``(1, C, p, patches * p)`` strip; the plan
  keeps host copies of ``target_sizes`` / ``target_sizes_videos`` and takes each row as the grid row ``(1, h, w)``;
  a crop gets ``h * w // 4`` placeholders in the default ``downsample_mode="4x"`` (``// 16`` in "16x");
* the tower (``make_vision_forward_target_sizes``) is handed the host sizes, the nearest-bucket position ids made on
  the device from host ints, the planned ``cu_seqlens`` (``NAVIT_CU_SEQLENS``) and the split sizes; the merger's
  per-crop loop (``height, width = target_sizes[batch_idx]``) runs on the host sizes the forward hands it;
* ``get_placeholder_mask`` serves both kinds through ``token_id`` (``PLACEHOLDER_BY_TOKEN_ID``) and the forward
  scatters both through one ``mask`` (``FEATURE_SCATTER_MASK``);
* the processor writes an image as ``<image_id>i</image_id>``, its thumbnail ``<image>`` + placeholders +
  ``</image>``, then its slices, a row of ``<slice>`` + placeholders + ``</slice>`` per line; a video frame likewise
  (the video placeholder), frames one after another.

MiniCPM-V 4.7 adds its own "canvas" M-RoPE (``get_rope_index``): host Python over ``input_ids.tolist()`` and
``mm_token_type_ids.tolist()`` that groups frames by their markers, stretches each thumbnail over its slices' canvas and
pins the ``<slice>`` markers to their corners, then ``rope_deltas`` on the device. The plan computes the same index in
NumPy per crop and frame on its host copies (``canvas_rope``; stock's own index on the host where that does not model
the layout: ``RotaryIndex.host_class``) and the forward's
``compute_3d_position_ids`` and generate()'s position setup (which prepends the text row) take the plan's positions
and deltas, moved with the plan without a wait (``make_host_rope_index``); the decode steps add the cached deltas on
the device, as stock. A call's own ``downsample_mode`` other than the config's runs stock's index on one read. Its
processor types the placeholders (``mm_token_type_ids``) and writes no id before a video.

In "16x" (the window merger inside the tower, MiniCPM-V 4.6's default) the merger shrinks every segment 4x and keeps
their count, which split sizes keyed by segment count cannot tell apart: the tower wrapper makes the window merger's
tables and the segments after it from the host sizes and hands them over for the call (see ``wrappers``).

In a forward ``torch.compile`` traces for a stream of layouts (``Layout.stream``) no crop's size is read: the tower
gets its position ids from one operator on the plan's host sizes and its segments as host lengths, the merger's and
the in-tower window merger's per-crop work each runs in one operator over the host crop sizes (``merger``), and the
borrowed Qwen3.5 text model's chunked delta rule, whose loop over 64-token chunks would be a graph per chunk count,
in one operator too (``rewrite/chunk_delta_rule.py``, as in Qwen3.5 itself).

The family's own code is in this folder: its edits (``edits``), the NaViT helpers they call (``navit``: the family's
``Family.helpers``, which its rewritten code sees under ``_syncfree`` beside the shared ``rewrite/helpers.py``), its
tower, merger and window merger wrappers (``wrappers``) and the operators they run (``merger``).
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Video, batch_builder
from ...plan.spec import Layout, RotaryIndex, TowerShape
from ...rewrite.edits import CHUNK_DELTA_RULE, ROPE_DELTAS_AFTER_CACHE, VISION_ATTENTION
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_generate, make_host_rope_index, make_model_forward
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import (
    MODEL_NEEDS,
    family_module,
    installed_source_has,
    )
from . import navit
from .edits import (
    FEATURE_SCATTER_MASK,
    FRAME_SIZES,
    HALVED_SIZES,
    MERGER_CROP_SIZE,
    NAVIT_CU_SEQLENS,
    NAVIT_MERGED_CU_SEQLENS,
    NAVIT_WINDOW_MERGER,
    PLACEHOLDER_BY_TOKEN_ID,
)
from .plan import PLAN
from .wrappers import make_merger_forward, make_vision_forward_target_sizes, make_window_merger_forward

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP",
           "build_minicpm_inputs", "MARKERS"]

_MODEL_PARAMS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "pixel_values_videos",
                 "target_sizes", "target_sizes_videos", "downsample_mode")

# MiniCPM-V 4.7's canvas M-RoPE index: what the wrapper finds the plan by, and the stock code it runs on the host.
_ROPE_PARAMS = ("input_ids", "mm_token_type_ids", "target_sizes", "target_sizes_videos", "downsample_mode",
                "attention_mask")
_ROPE_NEEDS = ("self._group_visual_frames(", "self.get_vision_position_ids(", "current_input_ids.tolist()")




def _minicpm(model_type: str, prefix: str, host_rope: bool = False) -> Family:
    """The family's targets; ``host_rope``: MiniCPM-V 4.7, whose forward also takes ``mm_token_type_ids`` and places
    its own canvas M-RoPE (``get_rope_index``: stock's, run on the plan's host copies)."""
    p = prefix
    targets = (
        Target(f"{p}VisionAttention", "forward", edits=VISION_ATTENTION),
        Target(f"{p}VisionModel", "forward", edits=NAVIT_CU_SEQLENS, wrap=make_vision_forward_target_sizes,
               params=("pixel_values", "target_sizes", "use_vit_merger"),
               needs=("self.embeddings(pixel_values, target_sizes=target_sizes, **kwargs)",
                      "get_max_seqlen(cu_seqlens, self.config, kwargs=kwargs)", "**kwargs,")),
        # Stock's code the wrapper relies on, kept: the position ids it takes from kwargs. The merger's loop runs on
        # the host sizes the forward hands it (in a traced forward: on the plan's rows).
        Target(f"{p}VisionEmbeddings", "forward", check_only=True,
               needs=("get_vision_nearest_position_ids(target_sizes, self.num_patches_per_side, kwargs=kwargs)",)),
        Target(f"{p}Merger", "forward", edits=MERGER_CROP_SIZE, wrap=make_merger_forward,
               params=("hidden_states", "target_sizes")),
        # The sizes get_image_features / get_video_features derive for the merger and the tower (only a traced forward
        # needs their rows).
        Target(f"{p}Model", "get_image_features", edits=HALVED_SIZES),
        Target(f"{p}Model", "get_video_features", edits=FRAME_SIZES),
        # The in-tower window merger ("16x") and the segments after it.
        Target(f"{p}ViTWindowAttentionMerger", "forward", edits=NAVIT_WINDOW_MERGER, wrap=make_window_merger_forward,
               params=("hidden_states", "target_sizes")),
        Target(f"{p}VisionModel", "get_downsampled_inputs", edits=NAVIT_MERGED_CU_SEQLENS),
        Target(f"{p}Model", "get_placeholder_mask", edits=PLACEHOLDER_BY_TOKEN_ID),
        Target(f"{p}Model", "forward", edits=FEATURE_SCATTER_MASK, wrap=make_model_forward,
               params=_MODEL_PARAMS + ("mm_token_type_ids",) if host_rope else _MODEL_PARAMS,
               needs=MODEL_NEEDS if host_rope else tuple(n for n in MODEL_NEEDS if n != "self.compute_3d_position_ids(")),
        Target(f"{p}ForConditionalGeneration", "generate", wrap=make_generate, inherited=True),
        # Qwen3.5's text model, borrowed: its chunked delta rule as one operator in a traced stream forward.
        Target("Qwen3_5GatedDeltaNet", "forward", edits=CHUNK_DELTA_RULE, module=family_module("qwen3_5"),
               borrowed=True),
    )
    if host_rope:  # (its own index, from the plan; generate()'s position setup calls it too)
        targets += (Target(f"{p}Model", "get_rope_index", wrap=make_host_rope_index, params=_ROPE_PARAMS,
                           needs=_ROPE_NEEDS),
                    # (the cache's length asked before the model's rope deltas, as in the Qwen-VL line: a traced
                    # forward without a cache then never guards on whether an earlier call left rope deltas)
                    Target(f"{p}Model", "compute_3d_position_ids", edits=ROPE_DELTAS_AFTER_CACHE, optional=True))
    # (mrope=False: the plan's Qwen-VL index and run checks do not apply; the host index is stock's own.)
    # One graph serves a stream of layouts (``Layout.stream``; tests/test_compile_stream.py): the NaViT strip's patch
    # dimension dynamic (``plan.dynamic_dims``), the tower handed its stream kwargs, the merger, the window merger and
    # Qwen3.5's chunked delta rule each one operator (``wrappers``, ``merger``, ``rewrite/chunk_delta_rule.py``).
    layout = Layout(family_module(model_type), vision_markers=False, token_types=host_rope,
                    tower=TowerShape(holds_projector=False, patch_tables=False), plan=PLAN,
                    rope=RotaryIndex(mrope=False, host_class=f"{p}Model" if host_rope else None), one_graph=True,
                    stream=True)
    return Family(model_type, targets, layout, helpers=navit)


# Registered where the installed code merges windows per crop by the window index (Transformers 5.24); 5.17's merger
# assumes crops of one size (a vectorised reshape): left stock there.
_WRITTEN_FOR = "patch_residual = patch.mean(dim=1)"
FAMILIES: tuple[Family, ...] = tuple(
    _minicpm(folder, prefix, rope) for folder, prefix, rope in (
        ("minicpm_ocr", "MiniCPMOcr", False), ("minicpmv4_6", "MiniCPMV4_6", False), ("minicpmv4_7", "MiniCPMV4_7", True))
    if installed_source_has(family_module(folder), _WRITTEN_FOR))

# Marker ids of the tiny presets' tokenizer (text tokens to the model): <image> </image> <slice> </slice> "\n"
# <image_id> </image_id>, and the digits of an image id.
MARKERS = dict(image_start=1002, image_end=1003, slice_start=1004, slice_end=1005, newline=1006, id_start=1007,
               id_end=1008, digit0=1010)

# A tiny model with the real layout rules: patch 14, "4x" (2x2 merge in the merger), a 2-layer tower, a 2-layer
# Qwen3.5 text model (a linear-attention layer and a full-attention layer). (``spatial_merge_size``: not a config
# value of this family; it tells syncfree's CLI the pixel unit of its inputs, patch x the "4x" merge. The model never
# reads it.)
_OCR_TINY = dict(
    model_type="minicpm_ocr", image_token_id=1000, video_token_id=1001, downsample_mode="4x",
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_channels=3, image_size=112, patch_size=14, spatial_merge_size=2),
    text_config=dict(model_type="qwen3_5_text", vocab_size=1024, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                     linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"],
                     max_position_embeddings=4096, pad_token_id=0, bos_token_id=None, eos_token_id=None),
)
# MiniCPM-V 4.6: "16x", the window merger after the tower's first layer (``insert_layer_id=0``: the tiny tower reaches
# it), 4 on a side in all (the CLI's pixel unit: 14 x 4).
_V46_TINY = dict(
    _OCR_TINY, model_type="minicpmv4_6", downsample_mode="16x", insert_layer_id=0, tie_word_embeddings=False,
    vision_config=dict(_OCR_TINY["vision_config"], spatial_merge_size=4),
)
# MiniCPM-V 4.7: 4.6's tower and text model; the config names the markers its canvas index reads, and a full-width
# rotary (``partial_rotary_factor`` 1, sections 2/3/3) lets each of the three axes move some frequencies.
_V47_TINY = dict(
    _V46_TINY, model_type="minicpmv4_7", image_start_id=MARKERS["image_start"], image_end_id=MARKERS["image_end"],
    slice_start_id=MARKERS["slice_start"], slice_end_id=MARKERS["slice_end"], newline_id=MARKERS["newline"],
    text_config=dict(_OCR_TINY["text_config"], rope_parameters=dict(
        rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0, mrope_section=[2, 3, 3],
        mrope_interleaved=True)),
)
PRESETS: dict[str, Preset] = {
    "minicpm-ocr-tiny": Preset("minicpm-ocr-tiny", _OCR_TINY, 0, "tiny MiniCPM-OCR for tests (NaViT crops, 4x)"),
    "minicpmv4-6-tiny": Preset("minicpmv4-6-tiny", _V46_TINY, 0,
                               "tiny MiniCPM-V 4.6 for tests (NaViT crops, 16x: the window merger in the tower)"),
    "minicpmv4-7-tiny": Preset("minicpmv4-7-tiny", _V47_TINY, 0,
                               "tiny MiniCPM-V 4.7 for tests (4.6's NaViT tower, 16x; its canvas M-RoPE)"),
}
VISION_CLASSES = {"minicpm_ocr": "MiniCPMOcrVisionModel", "minicpmv4_6": "MiniCPMV4_6VisionModel",
                  "minicpmv4_7": "MiniCPMV4_7VisionModel"}

SLICE = 4  # a slice's side in merged tokens (the tiny presets' stand-in for the processor's scale resolution)


def _merge(config) -> int:
    return 2 if getattr(config, "downsample_mode", "16x") == "4x" else 4


def _crops(item, patch: int, merge: int) -> tuple[tuple[int, int], list[list[tuple[int, int]]]]:
    """The thumbnail's (h, w) in patches and the slices' (h, w) by row: an image larger than ``SLICE`` merged
    tokens on a side is cut into ``ceil(side / SLICE)`` slices on that side, its thumbnail shrunk to fit one."""
    unit = patch * merge
    if item.height % unit or item.width % unit or item.height <= 0 or item.width <= 0:
        raise ValueError(f"{item}: height and width must be positive multiples of {unit} pixels")
    h, w = item.height // unit, item.width // unit  # merged tokens
    if h <= SLICE and w <= SLICE:
        return (h * merge, w * merge), []
    rows, cols = -(-h // SLICE), -(-w // SLICE)
    scale = SLICE / max(h, w)
    thumb = (max(1, round(h * scale)) * merge, max(1, round(w * scale)) * merge)
    return thumb, [[(SLICE * merge, SLICE * merge)] * cols for _ in range(rows)]


@batch_builder()
def build_minicpm_inputs(batch: Draft, *, use_image_id: bool = True) -> dict[str, torch.Tensor]:
    """Inputs laid out as ``MiniCPMOcrProcessor`` lays them out (see the module docstring): ``target_sizes`` holds
    each image's thumbnail then its slices row by row; ``target_sizes_videos`` each frame's; the pixels are one
    ``(1, C, p, patches * p)`` strip per modality."""
    config, m = batch.config, MARKERS
    vc = config.vision_config
    patch, merge = vc.patch_size, _merge(config)
    typed = config.model_type == "minicpmv4_7"  # (its processor types the placeholders, and writes no video ids)
    sizes = {1: [], 2: []}

    def crop(row: Row, token: int, kind: int, size: tuple[int, int], start: int, end: int) -> None:
        row.add([start])
        row.add([token] * (size[0] * size[1] // merge**2), kind)
        row.add([end])

    def place(row: Row, item: Image | Video) -> None:
        kind = 1 if isinstance(item, Image) else 2
        token = config.image_token_id if kind == 1 else config.video_token_id
        if token is None:
            raise ValueError(f"this {config.model_type} config has no {'image' if kind == 1 else 'video'} token id")
        thumb, slices = _crops(item, patch, merge)
        frames = 1 if kind == 1 else item.frames
        if use_image_id and not (typed and kind == 2):  # (a per-sample index before each image; 4.6: and video)
            n_images = row.ids.count(m["id_start"])  # (the sample's index so far: a text id is never a marker)
            row.add([m["id_start"]] + [m["digit0"] + int(d) for d in str(n_images)] + [m["id_end"]])
        for _ in range(frames):
            crop(row, token, kind, thumb, m["image_start"], m["image_end"])
            sizes[kind].append(thumb)
            for r, slice_row in enumerate(slices):
                if r:
                    row.add([m["newline"]])
                for size in slice_row:
                    crop(row, token, kind, size, m["slice_start"], m["slice_end"])
                    sizes[kind].append(size)

    specials = {config.image_token_id, config.video_token_id, *MARKERS.values(), *range(m["digit0"], m["digit0"] + 10)}
    out = batch.packed(batch.rows(place, avoid=specials), typed=typed)  # (4.6's and OCR's processors type none)
    channels = vc.num_channels
    for kind, pixels_name, sizes_name in ((1, "pixel_values", "target_sizes"),
                                          (2, "pixel_values_videos", "target_sizes_videos")):
        if sizes[kind]:
            patches = sum(h * w for h, w in sizes[kind])
            out[pixels_name] = torch.randn(1, channels, patch, patches * patch, generator=batch.gen)
            out[sizes_name] = torch.tensor(sizes[kind], dtype=torch.int32)
    return out


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_image_token(config) -> None:
    # The default leaves the image placeholder id unset (the checkpoint's tokenizer names it): any text id will do.
    if config.image_token_id is None:
        config.image_token_id = 5


CENSUS_FIXES = dict.fromkeys(("minicpm_ocr", "minicpmv4_6", "minicpmv4_7"), _census_fix_image_token)


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_minicpm_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    census_fixes=CENSUS_FIXES, display={"minicpm_ocr": "MiniCPM-OCR", "minicpmv4_6": "MiniCPM-V 4.6",
                                                        "minicpmv4_7": "MiniCPM-V 4.7"})
