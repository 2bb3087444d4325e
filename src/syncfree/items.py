"""The items a processor-style batch is written from, and the skeleton every family's batch builder runs.

A sample is a list of items, a batch a list of samples: ``[[Text(10), Image(448, 448), Text(12)]]``. ``Text(n)`` is
``n`` text tokens, ``Image`` and ``Video`` are in pixels after the processor's resize, ``Audio`` is mel frames (the
Whisper-style feature extractors') and ``Waveform`` raw samples. Which items a family's processor takes is the
family's (``check_items``).

A builder (``syncfree.families``: one per family, laid out as its processor lays a batch out) is the family's own
part under ``batch_builder``: the decorator checks the padding side and the items, seeds the random generator and
resolves the pad; ``Draft.rows`` runs the item loop (a ``Text`` is random text ids that read as no special token, any
other item is the family's ``place``), and ``Draft.packed`` pads the rows into ``input_ids``, ``attention_mask`` and
``mm_token_type_ids``. Pixels and features are random (a processor would normalize real ones to about this range);
every tensor is on the CPU, as a processor returns it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Union

import torch

from .plan.errors import InputsNotTaken

__all__ = ["Text", "Image", "Video", "Audio", "Waveform", "Item", "VISUAL_ITEMS", "check_items", "check_padding_side",
           "item_grid", "frame_timestamps", "random_text", "pack_rows", "pixel_inputs", "batch_builder", "Draft", "Row"]


@dataclass(frozen=True)
class Text:
    tokens: int


@dataclass(frozen=True)
class Image:
    height: int  # pixels, after the processor's resize (a multiple of patch_size * merge_size)
    width: int


@dataclass(frozen=True)
class Video:
    frames: int  # sampled frames, a multiple of the temporal patch size
    height: int
    width: int
    fps: float = 2.0  # sampling rate of those frames, for the timestamps


@dataclass(frozen=True)
class Audio:
    frames: int  # mel frames (100 per second of audio)


@dataclass(frozen=True)
class Waveform:
    """A mono audio clip of ``samples`` samples, for a processor that takes the raw waveform."""

    samples: int


Item = Union[Image, Video, Text]

# The items a processor takes where its family group does not say otherwise (``ITEMS``): text, images and videos.
VISUAL_ITEMS = (Text, Image, Video)


def check_items(model_type: str, samples, takes: tuple[type, ...] = VISUAL_ITEMS) -> None:
    """Refuse, in one line, a batch that is not a list of samples (each a list of items) or holds an item the
    family's processor does not take (an audio clip for a vision-only family, a string for ``Text(n)``)."""
    if not isinstance(samples, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in samples):
        raise TypeError(f"samples must be a list of samples, each a list of items (e.g. [[Text(4), Image(448, 448)]]), "
                        f"got {samples!r}")
    for sample in samples:
        for item in sample:
            if not isinstance(item, takes):
                names = ", ".join(t.__name__ for t in takes[:-1]) + f" and {takes[-1].__name__}"
                raise InputsNotTaken(f"{model_type} takes {names} items, got {item!r}")


def check_padding_side(padding_side: str) -> None:
    """Refuse a padding side a processor does not take."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")


def item_grid(item: Image | Video, patch: int, merge: int, temporal_patch: int) -> tuple[int, int, int]:
    """The ``(t, h, w)`` patch grid of an image or a video under a tower of ``patch`` pixels, ``merge`` x ``merge``
    merged patches and ``temporal_patch`` frames a patch."""
    unit = patch * merge
    if item.height % unit or item.width % unit or item.height <= 0 or item.width <= 0:
        raise ValueError(f"{item}: height and width must be positive multiples of {unit} pixels")
    t = 1
    if isinstance(item, Video):
        if item.frames <= 0 or item.frames % temporal_patch:
            raise ValueError(f"{item}: frames must be a positive multiple of {temporal_patch}")
        t = item.frames // temporal_patch
    return t, item.height // patch, item.width // patch


def frame_timestamps(frames: int, fps: float, temporal_patch: int) -> list[float]:
    """The time of each temporal patch of a video: a processor averages the times of the frames it merges."""
    times = [i / fps for i in range(frames)]
    return [(times[i] + times[i + temporal_patch - 1]) / 2 for i in range(0, frames, temporal_patch)]


def random_text(gen: torch.Generator, high: int, avoid: Collection[int], low: int = 1) -> Callable[[int], list[int]]:
    """``text(n)``: ``n`` random token ids in ``[low, high)`` drawn from ``gen``, each id in ``avoid`` (the family's
    special tokens, and the pad where the family's rows are padded) replaced by 1, so that a run of text never reads
    as a placeholder, a marker or padding."""

    def text(n: int) -> list[int]:
        return [i if i not in avoid else 1 for i in torch.randint(low, high, (n,), generator=gen).tolist()]

    return text


def pack_rows(rows: list[list[int]], types: list[list[int]], pad: int, padding_side: str) -> dict:
    """``input_ids``, ``attention_mask`` and ``mm_token_type_ids`` for token rows padded to the longest."""
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    mm_token_type_ids = torch.zeros((len(rows), length), dtype=torch.long)
    for b, (ids, kinds) in enumerate(zip(rows, types)):
        span = slice(length - len(ids), length) if padding_side == "left" else slice(0, len(ids))
        input_ids[b, span] = torch.tensor(ids, dtype=torch.long)
        attention_mask[b, span] = 1
        mm_token_type_ids[b, span] = torch.tensor(kinds, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "mm_token_type_ids": mm_token_type_ids}


def pixel_inputs(vision_config, image_grids: list, video_grids: list, gen: torch.Generator,
                 pixels_4d: bool = False) -> dict:
    """Random flattened patches and their ``(t, h, w)`` grids, as the image and video processors of a packed vision
    tower return them (``pixels_4d``: each patch as (channels, patch, patch), where an image processor returns it so)."""
    vc = vision_config
    channels = getattr(vc, "in_channels", None) or vc.num_channels  # (SigLIP-style configs: num_channels)
    features = channels * getattr(vc, "temporal_patch_size", 1) * vc.patch_size * vc.patch_size
    out = {}
    for grids, pixels, name in ((image_grids, "pixel_values", "image_grid_thw"),
                                (video_grids, "pixel_values_videos", "video_grid_thw")):
        if grids:
            grid = torch.tensor(grids, dtype=torch.long)
            out[pixels] = torch.randn(int(grid.prod(-1).sum()), features, generator=gen)
            if pixels_4d:
                out[pixels] = out[pixels].reshape(-1, channels, vc.patch_size, vc.patch_size)
            out[name] = grid
    return out


class Row:
    """One sample's tokens as a builder writes them: ``ids`` and, beside each, its kind (``kinds``: 0 text, 1 image,
    2 video, what a processor returns as ``mm_token_type_ids``)."""

    def __init__(self, text: Callable[[int], list[int]]):
        self.ids: list[int] = []
        self.kinds: list[int] = []
        self._text = text

    def add(self, ids: list[int], kind: int | list[int] = 0) -> None:
        """``ids``, each of ``kind`` (or one kind each, a list as long as ``ids``)."""
        self.ids += ids
        self.kinds += [kind] * len(ids) if isinstance(kind, int) else kind

    def text(self, n: int) -> None:
        """``n`` random text ids (kind 0): a timestamp or a separator the processor writes in text."""
        self.add(self._text(n))


class Draft:
    """The batch a builder is writing: the ``config`` and ``samples`` it was given, the ``padding_side``, the ``pad``
    id (the caller's, else the text config's, else 0) and the random generator ``gen`` every random id, pixel and
    feature is drawn from, in the order the builder draws them (the same seed, the same batch)."""

    def __init__(self, config, samples: list[list], padding_side: str, seed: int, pad_token_id: int | None):
        self.config, self.samples, self.padding_side = config, samples, padding_side
        self.pad = pad_token_id if pad_token_id is not None else (config.text_config.pad_token_id or 0)
        self.gen = torch.Generator().manual_seed(seed)

    def rows(self, place: Callable[[Row, object], None], *, avoid: Collection[int], high: int | None = None,
             low: int = 1, end_row: Callable[[Row], None] | None = None) -> list[Row]:
        """One ``Row`` per sample, its items in order: a ``Text(n)`` is ``n`` random ids in ``[low, high)`` (``high``:
        the text vocabulary's size) other than the ``avoid`` ids (the family's special tokens) and the pad; any other
        item is written by ``place(row, item)``; ``end_row(row)`` adds what the processor puts after a sample's
        items."""
        text = random_text(self.gen, self.config.text_config.vocab_size if high is None else high,
                           {*avoid, self.pad}, low)
        rows = []
        for sample in self.samples:
            row = Row(text)
            for item in sample:
                if isinstance(item, Text):
                    row.text(item.tokens)
                else:
                    place(row, item)
            if end_row is not None:
                end_row(row)
            rows.append(row)
        return rows

    def packed(self, rows: list[Row], *, typed: bool = True) -> dict:
        """``input_ids``, ``attention_mask`` and, where the processor returns them (``typed``), ``mm_token_type_ids``:
        the rows padded to the longest on the padding side."""
        out = pack_rows([r.ids for r in rows], [r.kinds for r in rows], self.pad, self.padding_side)
        if not typed:
            del out["mm_token_type_ids"]
        return out


def batch_builder(takes: tuple[type, ...] = VISUAL_ITEMS, *, default_pad: int | None = None) -> Callable:
    """The skeleton of a family's batch builder: ``@batch_builder(ITEMS)`` over ``build(draft, **options) -> dict``
    (the family's own part: its ``Draft.rows``, pixels and features) makes
    ``build(config, samples, *, padding_side="left", seed=0, pad_token_id=default_pad, **options)``, which refuses a
    padding side other than left or right and any item not in ``takes``, then hands the body the ``Draft``.
    ``default_pad``: the pad where the caller names none (None: the text config's, else 0)."""

    def decorate(body: Callable[..., dict]) -> Callable[..., dict]:
        def build(config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                  pad_token_id: int | None = default_pad, **options) -> dict:
            check_padding_side(padding_side)
            check_items(config.model_type, samples, takes)
            return body(Draft(config, samples, padding_side, seed, pad_token_id), **options)

        # (its signature: the public parameters, then the body's own options)
        public, own = inspect.signature(build), inspect.signature(body)
        functools.update_wrapper(build, body, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
        build.__signature__ = public.replace(parameters=[*list(public.parameters.values())[:-1],
                                                         *list(own.parameters.values())[1:]],
                                            return_annotation=own.return_annotation)
        return build

    return decorate
