"""The census's batch for each family: two images of different sizes, packed the way the family's processor packs them.

Every family here cuts images into patches, packs the patches of all images into one sequence and sends a
per-image grid with them; they differ in how the pixels are shaped, what the grid counts, how many text
placeholders an image gets and which extra tensors the forward wants. A family's ``Packing`` says that
(read from its processor and its ``get_image_features``); the default is the Qwen-VL layout, so a family
that takes it needs no entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["Packing", "PACKINGS", "census_batch", "qwen_vl_style_batch", "vision_field", "image_unit"]

# Config field spellings, first match wins: the same thing is named differently across families.
_MERGE = ("spatial_merge_size", "merge_size", "merge_kernel_size")
_TEMPORAL = ("temporal_patch_size", "patch_temporal")
_CHANNELS = ("in_channels", "num_channels")


def vision_field(vc, names: tuple[str, ...], default: int) -> int:
    """The first of ``names`` the vision config sets (a ``(h, w)`` kernel gives its h: the census's grids are square
    multiples of it), else ``default``."""
    for name in names:
        value = getattr(vc, name, None)
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int) and value > 0:
            return value
    return default


def image_unit(config) -> int:
    """Patch x merge of ``config``'s vision tower, in pixels: image sides are multiples of it (the merge is named
    differently across families; none: 1)."""
    vc = config.vision_config
    return vc.patch_size * vision_field(vc, _MERGE, 1)


def _qwen_tokens(t: int, h: int, w: int, merge: int) -> int:
    return t * h * w // merge**2


@dataclass(frozen=True)
class Packing:
    """How one family's processor packs images (defaults: Qwen2-VL's)."""

    # "flat": (patches, C*T*p*p); "conv": (patches, C, p, p) for a Conv2d patch embedding; "token": one
    # (p*m, p*m, C) block per text placeholder; "navit": all patches side by side in one (1, C, p, patches*p) strip.
    pixels: str = "flat"
    merge: int | None = None  # the merge the processor uses for images, where it is not the config's
    grid_in_tokens: bool = False  # the grid counts text placeholders, not patches
    grid_key: str = "image_grid_thw"
    grid_hw_only: bool = False  # (h, w) rows, no temporal column
    tokens: Callable[[int, int, int, int], int] = _qwen_tokens  # placeholders for a (t, h, w) patch grid, merge m
    reduce: int = 1  # grid sides are multiples of merge * reduce (merges applied after the tower's own)
    extra: Callable[[torch.Tensor, int], dict] = field(default=lambda grid, merge: {})


PACKINGS: dict[str, Packing] = {
    # HunYuan-ViT adds one newline placeholder after every merged row.
    "hy_v4_vl": Packing(tokens=lambda t, h, w, m: t * (h // m) * (w // m + 1)),
    # HunYuan-VL: the same, and a begin and an end placeholder around each image.
    "hunyuan_vl": Packing(tokens=lambda t, h, w, m: t * (h // m) * (w // m + 1) + 2),
    # Kimi-K2.5 (MoonViT) embeds each patch with a Conv2d.
    "kimi_k25": Packing(pixels="conv"),
    # Inkling2's processor sends one merged block of patches per image token, and grids in tokens.
    "inkling2": Packing(pixels="token", grid_in_tokens=True),
    # VideoLLaMA3 merges video frames only: images keep every patch, and the forward wants the merge per image.
    "video_llama_3": Packing(merge=1, extra=lambda grid, merge: {
        "image_merge_sizes": torch.full((len(grid),), merge, dtype=torch.long)}),
    # MiniCPM-V: NaViT-packed strip, (h, w) target sizes; the in-tower window merger and the resampler's merge
    # each halve both sides (16x fewer tokens than patches).
    **{name: Packing(pixels="navit", merge=2, grid_key="target_sizes", grid_hw_only=True, reduce=2,
                     tokens=lambda t, h, w, m: h * w // (4 * m * m))
       for name in ("minicpmv4_6", "minicpmv4_7")},
    # MiniCPM-OCR defaults to its "4x" mode: no window merger, so only the resampler's merge.
    "minicpm_ocr": Packing(pixels="navit", merge=2, grid_key="target_sizes", grid_hw_only=True),
}


def _image_token(config) -> int | None:
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _pixels(kind: str, grid: list[list[int]], patch: int, channels: int, temporal: int, merge: int,
            gen: torch.Generator) -> torch.Tensor:
    patches = sum(t * h * w for t, h, w in grid)
    if kind == "flat":
        return torch.randn(patches, channels * temporal * patch**2, generator=gen)
    if kind == "conv":
        return torch.randn(patches, channels, patch, patch, generator=gen)
    if kind == "token":
        return torch.randn(patches // merge**2, merge * patch, merge * patch, channels, generator=gen)
    if kind == "navit":
        return torch.randn(1, channels, patch, patches * patch, generator=gen)
    raise ValueError(f"unknown pixel packing {kind!r}")


def census_batch(model, images: int = 2, text: int = 6, packing: Packing | None = None) -> dict:
    """The family's packing of ``images`` images (sides 2, 4, ... merged units) between runs of ``text`` tokens, with
    ``mm_token_type_ids``, as its processor returns them."""
    packing = packing or PACKINGS.get(model.config.model_type, Packing())
    config = model.config
    vc = getattr(config, "vision_config", None)
    image_token = _image_token(config)
    if vc is None or image_token is None or not isinstance(getattr(vc, "patch_size", None), int):
        raise ValueError("no vision_config with an int patch_size and no image token id: not a Qwen-VL-style input")
    merge = packing.merge or vision_field(vc, _MERGE, 1)
    temporal = vision_field(vc, _TEMPORAL, 1)
    gen = torch.Generator().manual_seed(0)
    # Where the config names image start and end tokens, each image's placeholders sit between its own pair: a
    # forward that counts images by those boundaries needs them.
    start, end = (getattr(config, f"image_{edge}_token_id", None) for edge in ("start", "end"))
    bounds = ([start], [end]) if isinstance(start, int) and isinstance(end, int) else ([], [])
    grid, ids, types = [], [], []
    for i in range(images):
        side = 2 * merge * packing.reduce * (i + 1)  # in patches
        grid.append([1, side, side])
        tokens = packing.tokens(1, side, side, merge)
        ids += [11 + i] * text + bounds[0] + [image_token] * tokens + bounds[1]
        types += [0] * (text + len(bounds[0])) + [1] * tokens + [0] * len(bounds[1])
    ids += [12] * text
    types += [0] * text
    sent = [[t, h // merge, w // merge] if packing.grid_in_tokens else [t, h, w] for t, h, w in grid]
    grid_t = torch.tensor([row[1:] for row in sent] if packing.grid_hw_only else sent)
    return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "pixel_values": _pixels(packing.pixels, grid, vc.patch_size, vision_field(vc, _CHANNELS, 3), temporal,
                                    merge, gen),
            packing.grid_key: grid_t, "mm_token_type_ids": torch.tensor([types]), **packing.extra(grid_t, merge)}


def qwen_vl_style_batch(model, images: int = 2, text: int = 6) -> dict:
    """Flattened patches, ``image_grid_thw``, image placeholders in ``input_ids`` and ``mm_token_type_ids``."""
    return census_batch(model, images, text, Packing())
