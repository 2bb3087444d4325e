"""GLM-Image: an autoregressive image generator. Source images (image-to-image) go through a packed tower with learned
positions resampled by ``grid_sample`` and a VQ-VAE, whose codebook ids are written into their placeholders in
``input_ids``; the text model then generates the target image's tokens, placed by its own rotary index.

What is its own (survey 19 §4):

* ``image_grid_thw`` holds each sample's source grids and then the grids of the images to generate (one in
  image-to-image, a large one and a small preview in text-to-image), split by ``images_per_sample``; the target sizes
  are also written in the prompt as text (``grid_bos h w grid_eos``), which ends with the image start id. The plan
  keeps host copies of both and plans the tower for the sources only (``plan.PLAN``);
  the forward and generate() get the host copies, so stock's ``images_per_sample.tolist()``, ``sum(images_per_sample)``
  and per-image ``image_grid_thw[i].tolist()`` read host memory;
* the tower's embeddings index the grid with device tensors (``image_shapes[seq_ids, 1]``), as GLM-4.1V's do: it is
  handed the plan's copy of the grid on the device; it calls its blocks without kwargs (``BLOCK_KWARGS_NO_POSITIONS``);
* no embedding scatter: the placeholder check compares a device sum (``PLACEHOLDER_IDS_CHECK``: the plan's count), and
  the codes are scattered into ``input_ids`` (``IMAGE_IDS_SCATTER``), from which the rotary index is computed;
* its rotary index is its own (image start/end markers, per-sample grids) and leaves each row's decode positions on the
  model: stock's index runs on the host from the plan's copies, and the forward takes its positions and decode
  positions (a device tensor, as stock builds it) from the plan (``make_decode_cache_rope_index``).

Registered only where Transformers ships this code (5.24): 5.17's forward finds the sources by counting end markers.

The family's own code is in this folder: its stock line edits (``edits``), its part of the plan (``plan``) and its
rotary index wrapper (``wrappers``).
"""

from __future__ import annotations

import torch

from ...items import Draft, Image, Row, Text, batch_builder, item_grid, pixel_inputs
from ...plan.errors import InputsNotTaken
from ...plan.spec import Layout, RotaryIndex
from ...rewrite.edits import ROPE_DELTAS_AFTER_CACHE, VISION_ATTENTION
from ...rewrite.targets import Family, Target
from ...rewrite.wrappers import make_generate, make_model_forward, make_vision_forward_device_grid
from ..group import FamilyGroup
from ..preset import Preset
from ..shared import family_module, installed_source_has
from . import image_ids
from .edits import BLOCK_KWARGS_NO_POSITIONS, IMAGE_IDS_SCATTER, PLACEHOLDER_IDS_CHECK, SOURCE_FEATURES
from .plan import PLAN
from .wrappers import make_decode_cache_rope_index, make_traced_image_tokens, make_traced_source_grids

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "MODEL_CLASSES", "GROUP",
           "build_glm_image_inputs", "target_grids",
           "installed_code_supported"]

_MODELING = family_module("glm_image")
_MODEL = "GlmImageModel"

_TARGETS = (
    Target("GlmImageVisionAttention", "forward", edits=VISION_ATTENTION),
    # The tower: the plan's segment sizes and position ids, its grid on the device (the embeddings index it there).
    Target("GlmImageVisionModel", "forward", edits=BLOCK_KWARGS_NO_POSITIONS, wrap=make_vision_forward_device_grid,
           params=("pixel_values", "grid_thw"),
           needs=("get_vision_position_ids(grid_thw", "get_vision_attention_seqlens(grid_thw", "kwargs=kwargs",
                  "self.embeddings(", "grid_thw,")),
    Target(_MODEL, "get_placeholder_mask", edits=PLACEHOLDER_IDS_CHECK),
    Target(_MODEL, "forward", edits=IMAGE_IDS_SCATTER, wrap=make_model_forward,
           params=("input_ids", "attention_mask", "position_ids", "inputs_embeds", "pixel_values", "image_grid_thw",
                   "images_per_sample"),
           needs=("self.get_image_grids_for_generation(images_per_sample, image_grid_thw)",
                  "self.get_placeholder_mask(", "self.compute_3d_position_ids(", "self.language_model(")),
    # Its own index, from the plan, with what it leaves on the model for the decode steps.
    Target(_MODEL, "get_rope_index", wrap=make_decode_cache_rope_index,
           params=("input_ids", "image_grid_thw", "images_per_sample", "attention_mask"),
           needs=("images_per_sample.tolist()", "self._cached_decode_position_ids =", "self._prefill_len = seq_len")),
    # What the wrappers rely on beyond the functions they wrap: these read the grids and images_per_sample into Python,
    # which are the plan's host copies there; the decode steps slice the decode positions the index left.
    Target(_MODEL, "get_image_features", edits=SOURCE_FEATURES,
           needs=("sum(images_per_sample) == len(image_grid_thw)", "image_grid_thw[i].tolist()")),
    # (a traced forward: the plan's source grids, which the tower and get_image_features then find the plan's rows of)
    # (a traced forward of a stream: the images' VQ codes as one operator, which Inductor compiles for any image size)
    Target(_MODEL, "get_image_tokens", wrap=make_traced_image_tokens, params=("hidden_states",),
           needs=("self.vqmodel.encode(hs[None, ...])", "torch.cat(all_image_toks, dim=0)")),
    Target(_MODEL, "get_image_grids_for_generation", wrap=make_traced_source_grids,
           params=("images_per_sample", "image_grid_thw"), needs=("images_per_sample.tolist()",)),
    # (and a forward without a cache asks first whether it has one: no guard on rope deltas an earlier call left)
    Target(_MODEL, "compute_3d_position_ids", edits=ROPE_DELTAS_AFTER_CACHE,
           needs=("self._cached_decode_position_ids[:, :, step : step + seq_length]",)),
    Target("GlmImageForConditionalGeneration", "generate", wrap=make_generate, inherited=True),
)


def installed_code_supported() -> bool:
    """Transformers 5.24's GLM-Image: sources split off by ``get_image_grids_for_generation``, decode positions cached
    by its index. 5.17's forward counts end markers on the device instead: not registered there (read from the file)."""
    return installed_source_has(_MODELING, "def get_image_grids_for_generation(", "self._cached_decode_position_ids =",
                                "sum(images_per_sample) == len(image_grid_thw)")


FAMILIES: tuple[Family, ...] = () if not installed_code_supported() else (
    Family("glm_image", _TARGETS, Layout(_MODELING, token_types=False, rope=RotaryIndex(host_class=_MODEL), plan=PLAN,
                                         one_graph=True, stream=True), helpers=image_ids),
)

# A tiny model with the real layout rules: patch 16, no merge, a learned 8x8 position table (image_size 128) resampled
# to every grid; a 64-code VQ-VAE whose codes lie below the image start and end ids (64, 65; 16384, 16385 published);
# M-RoPE over half of each text head. Its head predicts the whole vocabulary (the published one only its 16512 image
# tokens), as Transformers' own tests have it: stock's loss views the logits by the text vocabulary's size.
_TINY = dict(
    model_type="glm_image", image_token_id=1000, image_start_token_id=64, image_end_token_id=65,
    vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, image_size=128,
                       patch_size=16, spatial_merge_size=1, hidden_act="gelu", attention_bias=True),
    vq_config=dict(embed_dim=16, num_embeddings=64, latent_channels=32, in_channels=3),
    text_config=dict(vocab_size=1024, vision_vocab_size=1024, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                     rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=65,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1],
                                          partial_rotary_factor=0.5)),
)
PRESETS: dict[str, Preset] = {
    "glm-image-tiny": Preset("glm-image-tiny", _TINY, 0, "tiny GLM-Image for tests (VQ codes into input_ids)"),
}
VISION_CLASSES = {"glm_image": "GlmImageVisionModel"}


def _model_class(_model_type: str):
    from transformers import GlmImageForConditionalGeneration  # (no auto class builds it from its config)

    return GlmImageForConditionalGeneration


MODEL_CLASSES: dict = {"glm_image": _model_class} if FAMILIES else {}

# The processor's default target size (GlmImageProcessor.target_h / target_w), in pixels.
TARGET = (1152, 768)


def target_grids(height: int, width: int, text_to_image: bool) -> list[tuple[int, int, int]]:
    """The grids of the images to generate at ``height`` x ``width`` pixels (``GlmImageProcessor._get_target_shape``):
    32 pixels a token; in text-to-image also a preview of about 16 x 16 tokens of the same aspect."""
    token_h, token_w = height // 32, width // 32
    ratio = token_h / token_w
    preview = (1, int(ratio**0.5 * 16), int((1 / ratio) ** 0.5 * 16))
    return [(1, token_h, token_w)] + ([preview] if text_to_image else [])


@batch_builder()
def build_glm_image_inputs(batch: Draft, *, target: tuple[int, int] = TARGET) -> dict:
    """Inputs laid out as ``GlmImageProcessor`` lays them out: a source image is the image start id, its placeholders,
    the image end id; each prompt then names its target size as text (a grid-begin id, h's digits, a space, w's digits,
    a grid-end id; in text-to-image the preview's size after it) and ends with the image start id, from which the
    target image is generated. ``image_grid_thw`` lists each sample's source grids, then its target grids (one in
    image-to-image, two in text-to-image: a batch without any image), ``images_per_sample`` how many rows each sample
    has. Every sample has the same number of source images (the processor refuses others). No ``mm_token_type_ids``.
    The grid-begin/-end, digit and space ids are the preset's own (the tokenizer's are not in the config)."""
    config, samples = batch.config, batch.samples
    if any(not isinstance(item, (Image, Text)) for sample in samples for item in sample):
        raise InputsNotTaken(f"{config.model_type} takes images and text only (its forward has no video inputs)")
    counts = {sum(isinstance(item, Image) for item in sample) for sample in samples}
    if len(counts) > 1:
        raise InputsNotTaken(f"{config.model_type}'s processor needs the same number of source images in every sample "
                             f"(image-to-image), or none in any (text-to-image); got {sorted(counts)}")
    vc = config.vision_config
    patch, merge = vc.patch_size, vc.spatial_merge_size
    image, start, end = config.image_token_id, config.image_start_token_id, config.image_end_token_id
    grid_bos, grid_eos, space, digit0 = image + 1, image + 2, image + 3, image + 4
    targets = target_grids(*target, text_to_image=counts == {0})
    grids, sources = [], []

    def size(h: int, w: int) -> list[int]:
        return [grid_bos, *(digit0 + int(d) for d in str(h)), space, *(digit0 + int(d) for d in str(w)), grid_eos]

    def place(row: Row, item: Image) -> None:
        t, h, w = item_grid(item, patch, merge, 1)
        grids.append((t, h, w))
        sources.append((t, h, w))
        row.add([start] + [image] * (t * h * w // merge**2) + [end])

    def end_row(row: Row) -> None:  # (the prompt's target sizes, then the start of the image to generate)
        for _, h, w in targets:
            row.add(size(h, w))
        row.add([start])
        grids.extend(targets)

    rows = batch.rows(place, avoid={image, start, end, grid_bos, grid_eos, space, *range(digit0, digit0 + 10)},
                      end_row=end_row)
    out = batch.packed(rows, typed=False)
    out.update(pixel_inputs(vc, sources, [], batch.gen))
    out["image_grid_thw"] = torch.tensor(grids, dtype=torch.long)
    out["images_per_sample"] = torch.full((len(samples),), len(grids) // len(samples), dtype=torch.long)
    return out


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_glm_image(config) -> None:
    # Its VQ-VAE quantizes the tower's features: its input width (latent_channels) is the tower's, which the shrink
    # changed (the VQ config names it otherwise).
    config.vq_config.latent_channels = config.vision_config.hidden_size


CENSUS_FIXES = {"glm_image": _census_fix_glm_image}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_glm_image_inputs, presets=PRESETS, vision_classes=VISION_CLASSES,
                    model_classes=MODEL_CLASSES, census_fixes=CENSUS_FIXES, display={"glm_image": "GLM-Image"})
