"""``Buckets``: pad a batch up to one of a few fixed shapes, so that a stream of layouts makes a few static shapes.

CUDA graphs (``torch.compile(mode="reduce-overhead")``) replay a recording made for one set of input shapes; a stream
whose text lengths, image sizes and image counts vary makes a recording per batch. With buckets, ``prepare`` (or the
``planning_collator``) pads each batch up to the smallest bucket that holds it, along three sizes:

- ``tokens``: the row length. Tokens are appended on the right of every row (masked, ``labels`` ``-100``): a
  bucketed batch is padded on the right (a left-padded one is refused), as training batches are;
- ``patches``: the image patches (``pixel_values``' rows), and ``items``: the number of images. The missing patches
  and images come as *filler images* (zero pixels) placed after the last attended token of one row, laid out as the
  family's processor lays out an image, attended and with ``labels`` ``-100``.

The padded batch is a batch stock takes as it is: nothing of the model changes. A real token never sees what was
added: the padding is masked, and the filler images come after the row's last real token, under the causal mask;
each image is its own segment in the vision tower. So the real tokens' outputs are the unbucketed batch's, up to the
rounding of kernels run on other shapes (tests/test_buckets.py states the bound).

Buckets serve forwards and training steps; a bucketed batch is not for ``generate`` (its rows end in filler images).
A batch no bucket holds gets a one-line ``ValueError`` naming the size that is missing. Video batches are not
bucketed (a video's frames are laid out per family, with timestamps in some).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["Buckets", "bucket_batch"]

# Per-token inputs and what their padding holds: ``None`` for the pad id.
_PER_TOKEN = {"input_ids": None, "attention_mask": 0, "mm_token_type_ids": 0, "labels": -100}
_IMAGES = ("pixel_values", "image_grid_thw")
_VIDEOS = ("pixel_values_videos", "video_grid_thw")


def _sizes(name: str, values) -> tuple[int, ...]:
    values = tuple(values)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ValueError(f"syncfree.Buckets: {name} must be positive ints, got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"syncfree.Buckets: {name} has a size twice: {values!r}")
    return tuple(sorted(values))


@dataclass(frozen=True)
class Buckets:
    """The sizes a batch is padded up to: ``tokens`` (row lengths), ``patches`` (image patches, ``pixel_values``'
    rows) and ``items`` (images). Each a few sizes, in any order; ``patches`` and ``items`` needed for batches with
    images. ``pad_token_id``: the id of the padding tokens (default: the model's pad id, else 0)."""

    tokens: tuple[int, ...]
    patches: tuple[int, ...] = ()
    items: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", _sizes("tokens", self.tokens))
        object.__setattr__(self, "patches", _sizes("patches", self.patches))
        object.__setattr__(self, "items", _sizes("items", self.items))
        if not self.tokens:
            raise ValueError("syncfree.Buckets: give at least one size of tokens")
        if bool(self.patches) != bool(self.items):
            raise ValueError("syncfree.Buckets: give patches and items together (the images' patches and their count)")

    @classmethod
    def powers_of_two(cls, max_tokens: int, max_patches: int = 0, max_items: int = 0, *, smallest_tokens: int = 64,
                      smallest_patches: int = 256, pad_token_id: int | None = None) -> "Buckets":
        """Sizes doubling from the smallest up to the max (included): about log2(max/smallest) buckets each."""
        def doubling(low: int, high: int) -> tuple[int, ...]:
            sizes = []
            while low < high:
                sizes.append(low)
                low *= 2
            return (*sizes, high) if high > 0 else ()
        return cls(doubling(smallest_tokens, max_tokens), doubling(smallest_patches, max_patches),
                   doubling(1, max_items), pad_token_id)

    def key(self, batch: Mapping) -> tuple:
        """The bucket a bucketed batch is in: its rows, row length, patches and images (its input set aside)."""
        ids, pixels = batch["input_ids"], batch.get("pixel_values")
        return (*ids.shape, *(() if pixels is None else (pixels.shape[0], batch["image_grid_thw"].shape[0])))


def _smallest(sizes: tuple[int, ...], at_least: int) -> int | None:
    i = bisect.bisect_left(sizes, at_least)
    return sizes[i] if i < len(sizes) else None


# (config id, merge, patch, width) -> (config, tokens, types): a stream meets a few filler widths per config.
_FILLERS: dict[tuple, tuple] = {}


def _filler_tokens(build, config, merge: int, patch: int, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tokens (and token types) of one image of ``merge`` x ``width`` patches as the family's processor lays it
    out: one row, nothing else in it."""
    key = (id(config), merge, patch, width)
    kept = _FILLERS.get(key)
    if kept is None or kept[0] is not config:
        from .inputs import Image

        one = build(config, [[Image(merge * patch, width * patch)]], padding_side="right")
        types = one["mm_token_type_ids"][0] if "mm_token_type_ids" in one else None
        kept = (config, one["input_ids"][0], types)
        if len(_FILLERS) < 1024:  # (bounded: odd widths are laid out again rather than kept)
            _FILLERS[key] = kept
    return kept[1], kept[2]


def _fillers(missing_items: int, missing_patches: int, merge: int) -> list[int] | None:
    """Widths (in patches, ``merge`` rows each) of ``missing_items`` filler images of ``missing_patches`` patches in
    all: the smallest images but the last, which takes the rest; None where they cannot be laid out."""
    least = merge * merge
    if missing_items == 0:
        return [] if missing_patches == 0 else None
    rest = missing_patches - (missing_items - 1) * least
    if rest < least or rest % least:
        return None
    return [merge] * (missing_items - 1) + [rest // merge]


def _row_ends(batch: Mapping) -> torch.Tensor:
    """Each row's end: one past its last attended token (its length without a mask)."""
    ids, mask = batch["input_ids"], batch.get("attention_mask")
    if mask is None:
        return torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long)
    attended = mask.to(torch.bool)
    positions = torch.arange(1, ids.shape[1] + 1).expand_as(attended)
    return torch.where(attended, positions, 0).amax(1)


def _images_before(ids: torch.Tensor, row: int, image_token_id: int, images: int) -> int:
    """How many of the batch's images come before the end of ``row`` of ``ids`` (grids and pixels are in token order):
    each image is one run of placeholder tokens; where the runs do not count the images, the fillers go last."""
    placeholder = ids == image_token_id
    starts = placeholder.clone()
    starts[:, 1:] &= ~placeholder[:, :-1]
    runs = starts.sum(1)
    if int(runs.sum()) != images:
        return images
    return int(runs[: row + 1].sum())


def bucket_batch(batch: Mapping, buckets: Buckets, config, build) -> dict:
    """``batch`` padded up to the smallest bucket that holds it (see the module's docstring); ``build`` is the
    family's batch builder (``syncfree.inputs.processor_batch``), which lays out the filler images. A batch already
    at a bucket's sizes is returned as it is."""
    if not isinstance(buckets, Buckets):
        raise ValueError(f"buckets must be a syncfree.Buckets, got {type(buckets).__name__}")
    batch = dict(batch)
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("syncfree buckets pad input_ids of shape (rows, tokens); this batch has none")
    if any(isinstance(batch.get(n), torch.Tensor) for n in _VIDEOS):
        raise ValueError("syncfree buckets pad text and images; this batch has videos (leave buckets out for it)")
    B, S = ids.shape
    for name, value in batch.items():
        if name not in _PER_TOKEN and name not in _IMAGES and value is not None:
            raise ValueError(f"syncfree buckets pad text and images (input_ids, attention_mask, mm_token_type_ids, "
                             f"labels, pixel_values, image_grid_thw); this batch also has {name}")
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and (mask[:, :1] == 0).logical_and(mask.bool().any(1, keepdim=True)).any():
        # (appending on the right of a left-padded row would pad it on both sides, which not every family's positions
        # take as stock takes one-sided padding)
        raise ValueError("syncfree buckets pad rows on the right; this batch is padded on the left: pad it on the "
                         "right (processor(..., padding_side=\"right\"), as training batches are)")
    pixels, grid = batch.get("pixel_values"), batch.get("image_grid_thw")
    if isinstance(pixels, torch.Tensor) != isinstance(grid, torch.Tensor):
        raise ValueError("syncfree buckets pad images given as pixel_values with their image_grid_thw; this batch "
                         f"has only {'pixel_values' if isinstance(pixels, torch.Tensor) else 'image_grid_thw'}")
    widths: list[int] = []
    if isinstance(pixels, torch.Tensor):
        if not buckets.patches:
            raise ValueError("syncfree buckets: this batch has images; give Buckets(patches=..., items=...) too")
        merge = getattr(config.vision_config, "spatial_merge_size", None)
        if not isinstance(merge, int):
            raise ValueError(f"syncfree buckets lay out filler images by the vision config's spatial_merge_size, "
                             f"which {config.model_type} has not; leave buckets out for this family")
        P, N = pixels.shape[0], grid.shape[0]
        found = None
        for items in (s for s in buckets.items if s >= N):
            for patches in (s for s in buckets.patches if s >= P):
                if patches % (merge * merge):
                    raise ValueError(f"syncfree buckets: {patches} patches is not a multiple of {merge * merge} "
                                     "(the merge size squared)")
                fill = _fillers(items - N, patches - P, merge)
                if fill is not None:
                    found = (patches, fill)
                    break
            if found is not None:
                break
        if found is None:
            raise ValueError(f"syncfree buckets: no bucket holds {N} images of {P} patches (largest: "
                             f"{buckets.items[-1]} images, {buckets.patches[-1]} patches)")
        widths = found[1]
    laid = [_filler_tokens(build, config, merge, config.vision_config.patch_size, w) for w in widths]
    if laid and config.image_token_id in (int(laid[0][0][0]), int(laid[0][0][-1])):
        # (without a marker at each end, a filler's placeholders would run on into the image before it or after it)
        raise ValueError(f"syncfree buckets place filler images between markers, and {config.model_type}'s "
                         "processor puts none around an image; leave buckets out for this family")
    filler_tokens = sum(t.shape[0] for t, _ in laid)
    ends = _row_ends(batch)
    row = int(ends.argmin())
    need = max(S, int(ends[row]) + filler_tokens)
    length = _smallest(buckets.tokens, need)
    if length is None:
        raise ValueError(f"syncfree buckets: no bucket holds rows of {need} tokens ({S} in the batch"
                         + (f", {filler_tokens} of filler images" if filler_tokens else "")
                         + f"; the largest is {buckets.tokens[-1]})")
    if length == S and not widths:
        return batch
    pad_id = buckets.pad_token_id
    if pad_id is None:
        pad_id = getattr(config.get_text_config(), "pad_token_id", None)
        pad_id = 0 if pad_id is None else pad_id
    if batch.get("attention_mask") is None:
        batch["attention_mask"] = torch.ones_like(ids)
    for name, fill in _PER_TOKEN.items():
        value = batch.get(name)
        if isinstance(value, torch.Tensor):
            grown = value.new_full((B, length), pad_id if fill is None else fill)
            grown[:, :S] = value
            batch[name] = grown
    if widths:
        start = int(ends[row])
        before = _images_before(ids, row, config.image_token_id, grid.shape[0])
        for tokens, types in laid:
            span = slice(start, start + tokens.shape[0])
            batch["input_ids"][row, span] = tokens
            batch["attention_mask"][row, span] = 1
            if "mm_token_type_ids" in batch and types is not None:
                batch["mm_token_type_ids"][row, span] = types
            start += tokens.shape[0]
        offset = int((grid[:before].prod(1)).sum())
        filler = pixels.new_zeros((sum(merge * w for w in widths), *pixels.shape[1:]))
        batch["pixel_values"] = torch.cat([pixels[:offset], filler, pixels[offset:]])
        grids = grid.new_tensor([[1, merge, w] for w in widths])
        batch["image_grid_thw"] = torch.cat([grid[:before], grids, grid[before:]])
    return batch
