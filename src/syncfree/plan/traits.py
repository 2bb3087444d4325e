"""A family's traits: the small frozen objects its ``Layout`` holds, one concept each, where it differs from the
shared plan.

Each trait's defaults are the shared plan's behaviour (the vision code the families copied: no learned table, one
attention segment per frame, ``t*h*w / merge**2`` features per item, one placeholder run per video, a 3D rotary index
computed by the shared plan, no audio), so a family declares only what it does otherwise. The plan reads the traits
through the ``ModelSpec`` (which carries them beside the values read from the config) and asks them what they decide
(``TowerShape.split_sizes``), instead of branching on one flag per family. Traits are frozen, hashable (the vision
tables' stock check is cached by them) and picklable (plans travel from ``DataLoader`` workers with their spec).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import GridError

__all__ = ["PositionTable", "TowerShape", "VideoLayout", "RotaryIndex", "AudioLayout"]


@dataclass(frozen=True)
class PositionTable:
    """A vision tower's learned position table, which stock resamples to each grid (the plan makes the taps): how the
    family's tower reads it. Declared by the family (``Layout(table=PositionTable(...))``)."""

    # Where its side comes from: ``num_position_embeddings`` (its square root), ``image_size`` (image_size //
    # patch_size), or the vision config attribute that holds it.
    side: str = "num_position_embeddings"
    # The class whose ``self.interpolation_align_corners = ...`` says how it is resampled (it changed between
    # releases); None: align_corners=True, the helpers' fixed choice where no class says.
    align_corners_from: str | None = None
    mode: str = "bilinear"  # stock's interpolation mode (``mode=``: "bicubic" takes 16 taps)
    swap_hw: bool = False  # read at (w, h) (stock's helper takes ``grid_thw[:, [0, 2, 1]]``)
    padding: str = "border"  # outside the table: the border's values, or zeros


@dataclass(frozen=True)
class TowerShape:
    """How the family's vision tower is built and what it makes of a grid row: its attention segments, the features
    (placeholders) per image or video, its rotary ids. The defaults: the shared plan's tower (the family's own module, a
    ``spatial_merge_size`` merge in its merger, which projects to the text width; one segment of h*w patches per frame;
    ``t*h*w / merge**2`` features per item; (row, col) rotary ids)."""

    # The module holding the vision tower, where it is not the family's own (a family that runs another's tower).
    modeling: str | None = None
    # The vision config's name for its merge.
    merge_attr: str = "spatial_merge_size"
    # A tower that merges patches only after its encoder: the merge its own helpers take (1), else None (the spec's
    # merge); its learned table is then image_size // patch_size on a side.
    encoder_merge: int | None = None
    # Window attention; windows as many patches on a side as the position table (else the config's window size).
    windows: bool = False
    window_from_table: bool = False
    # A pixel shuffle by the merge after the encoder (its gather index is one of the plan's tables).
    pixel_shuffle: bool = False
    # The processor's pixels are (patches, channels, patch, patch), not (patches, channels * patch * patch).
    pixels_4d: bool = False
    # The tower ends in the projector to the text width (its merger); False where a projector outside it follows:
    # vision_every_step's one-unit tower pass would not reach that projector.
    holds_projector: bool = True
    # Each image and video comes with its own spatial merge size, a forward input (``image_merge_sizes`` /
    # ``video_merge_sizes``) instead of a config value: the plan keeps them on the host per item (``item_merges``).
    item_merge_sizes: bool = False
    # Placeholders beyond the merged patches: tokens the merger appends to each merged row (a newline column: 1) and
    # to each image (begin and end embeddings: 2).
    row_extra_tokens: int = 0
    item_extra_tokens: int = 0
    # The tower attends over each image or video as one segment (stock's ``merge_temporal=True``), not frame by frame;
    # and its rotary ids carry the frame, (t, row, col) (``include_temporal=True``).
    clip_segments: bool = False
    temporal_position_ids: bool = False
    # The tower prepends a class token to each attention segment (each frame) before its blocks and drops them before
    # its merger: the attention splits segments one token longer than their patches, and stock's
    # ``get_vision_frame_lengths`` takes the per-frame patch counts from the plan (``frame_lengths``).
    segment_class_token: bool = False
    # A tower with a ``merge_kernel_size`` (h, w) instead of ``spatial_merge_size`` that, after its encoder, averages
    # each clip's frames onto one frame's merged tokens (a grid row yields h*w/merge**2 tokens whatever its t), and it
    # adds a frame embedding per patch: the split sizes ignore t, and the plan makes the frame index and the pooling's
    # destination and weight (``ModelSpec.temporal_pooling``: the kernel).
    temporal_pooling: bool = False
    # The tower reads the plan's per-patch tables (rotary ids, interpolation, windows: ``VisionPlan.tables``, made on
    # the device from its item table). False for a tower that makes its own position ids and takes only segment sizes:
    # the plan then makes no item table (host time per item and bytes uploaded that nothing would read).
    patch_tables: bool = True
    # The tower's caller asks it for hidden states on every call, which Transformers records with forward hooks it
    # installs at the first such call, under a lock: a traced forward can neither take the lock nor register hooks,
    # so a patched instance's tower gets them when patched (``before_trace.install_output_recording``).
    records_hidden_states: bool = False

    def segment_lengths(self, t: np.ndarray, h: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Patches per attention segment of the grid columns ``t, h, w`` (NumPy): one segment per frame, or per
        image or video (``clip_segments``)."""
        return t * h * w if self.clip_segments else np.repeat(h * w, t)

    def split_sizes(self, t: np.ndarray, h: np.ndarray, w: np.ndarray, merge, temporal_merge: int = 1) -> np.ndarray:
        """Features (placeholders) per image or video of the grid columns ``t, h, w`` (NumPy) under ``merge`` (one
        merge, or one per row), as the tower's merger yields them; ``temporal_merge``: frames merged into one token
        after the tower (a resampler's videos: 2), as stock's ``prod(-1) // merge**2 // temporal_merge_size``."""
        if self.temporal_pooling:  # a clip's frames averaged onto one frame's tokens
            return h * w // merge**2
        if self.row_extra_tokens or self.item_extra_tokens:  # (a merger that adds a newline per row, begin and end)
            return t * (h // merge) * (w // merge + self.row_extra_tokens) + self.item_extra_tokens
        return t * h * w // merge**2 // temporal_merge

    def split_rule(self, merge: int) -> str:
        """``split_sizes``' rule in words, for an error (``merge``: the spec's merge on a side)."""
        if self.row_extra_tokens or self.item_extra_tokens:
            return f"t*(h/m)*(w/m + {self.row_extra_tokens}) + {self.item_extra_tokens}, m = {merge}"
        return f"t*h*w / {merge**2}"

    @property
    def segment_prefix(self) -> int:
        """Tokens the tower prepends to each attention segment (its class token), which its attention's split sizes
        count and the patch counts do not."""
        return int(self.segment_class_token)

    def features_follow_patches(self, features: int, patches: int, merge: int) -> bool:
        """Whether the features of all items together are the patches over the merge squared (no tokens added, none
        pooled away; a class token per segment is dropped before the merger, so it adds none)."""
        return features * merge**2 == patches

    def item_merges(self, grid: torch.Tensor, rows: tuple, merge_sizes, name: str):
        """The rows' own merge sizes, checked, as a host (N,) int64 tensor and a list of ints (``item_merge_sizes``,
        where the forward is handed them); None where the merge is the spec's."""
        if not self.item_merge_sizes or merge_sizes is None:
            return None
        merges_name = name.replace("grid_thw", "merge_sizes")
        if not isinstance(merge_sizes, torch.Tensor) or merge_sizes.shape != (grid.shape[0],) \
                or merge_sizes.dtype.is_floating_point or merge_sizes.dtype == torch.bool:
            raise ValueError(f"{merges_name} must be an integer tensor of shape ({grid.shape[0]},) (one per {name} "
                             f"row), got {getattr(merge_sizes, 'shape', type(merge_sizes).__name__)}")
        merge_sizes = merge_sizes.to("cpu", torch.long)
        merges = merge_sizes.tolist()  # host tensor: no device involved
        if any(m <= 0 or h % m or w % m for (_, h, w), m in zip(rows, merges)):
            raise GridError(f"{name} heights and widths must be multiples of their {merges_name}, got {grid.tolist()} "
                            f"and {merges}")
        return merge_sizes, merges


@dataclass(frozen=True)
class VideoLayout:
    """How the family lays out a video's placeholders and positions. The defaults: the shared plan's (one placeholder run per
    video, typed 2 by ``mm_token_type_ids``, positions stepping one per frame, every frame a token)."""

    # Each video frame is its own placeholder run, timestamps between.
    frames_as_runs: bool = False
    # Video positions step by tokens_per_second * seconds (``ModelSpec.tokens_per_second``).
    time_scale: bool = False
    # Video frames are merged in groups of ``vision_config.temporal_merge_size`` after the tower (a resampler): a
    # video's placeholders and its temporal positions count t // that size frames (``ModelSpec.video_temporal_merge``).
    temporal_merge: bool = False
    # Video frames are written with the image placeholder and typed 2 only by mm_token_type_ids; stock counts
    # "video" placeholders as image tokens, and the tower sees each frame as its own (1, h, w) grid row.
    frames_as_images: bool = False
    # Video frames are image placeholders that lie between the config's video start and end ids: the plan types
    # tokens by those spans from input_ids (stock's get_placeholder_mask does, and counts the two kinds apart), not from
    # mm_token_type_ids (``ModelSpec.video_span_ids``). With ``frames_as_images`` for the tower's per-frame grid rows.
    spans: bool = False


@dataclass(frozen=True)
class RotaryIndex:
    """How the family's positions are made. The default: a 3D rotary index (M-RoPE) that the shared plan computes."""

    # 3D rotary positions (M-RoPE) from a get_rope_index; False: the text model numbers tokens 0..S-1 itself, so
    # the plan computes no positions and placeholder runs carry no meaning.
    mrope: bool = True
    # A rotary index of the family's own that the plan runs as stock on the host (``rope_stock.stock_rope_index``):
    # the class defining it. Unlike ``audio_class``, a batch of text, images and videos (no audio).
    host_class: str | None = None
    # A rotary index interleaving audio and video by time that the plan runs as stock on the host: the class defining
    # it (with an audio encoder, ``AudioLayout.encoder``).
    audio_class: str | None = None


@dataclass(frozen=True)
class AudioLayout:
    """The family's audio inputs. The default: none."""

    # An audio encoder whose windows the plan makes (``ModelSpec.audio_window``), with its placeholders.
    encoder: bool = False
    # Audio placeholders (``config.audio_token_id``) the plan counts, without an audio encoder's plan.
    tokens: bool = False
