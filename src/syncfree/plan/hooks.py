"""What a family adds to the shared plan: its ``PlanHooks``, declared in the family's folder and called by the plan.

The plan in this package is the shared one: token types, placeholder runs, vision plans from ``*_grid_thw`` rows,
a 3D rotary index (M-RoPE). A family whose batch carries more control inputs, whose grids come another way, or whose
positions are its own says so in its ``PlanHooks`` (``Layout.plan``) instead of adding a flag to the shared layout:
the plan calls what the family declares and knows nothing else of it.

Hooks are module-level functions: a plan is pickled with its spec (``DataLoader`` workers), and the spec holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .registry import REGISTRY

__all__ = ["PlanHooks", "SHARED_INPUTS", "plan_inputs"]

# The control inputs every plan reads (host copies, checksums, staleness checks).
SHARED_INPUTS = ("input_ids", "mm_token_type_ids", "attention_mask", "image_grid_thw", "video_grid_thw",
                 "second_per_grid_ts", "position_ids")


@dataclass(frozen=True)
class PlanHooks:
    """A family's part of the plan. Every field is optional; the defaults are the shared plan's behaviour."""

    # Control inputs beyond ``SHARED_INPUTS`` that the plan keeps host copies of, checks and hands the forward.
    inputs: tuple[str, ...] = ()
    # How generate() expands them for beams: one row per batch row (repeated as the rows), or one row per image or
    # video item, as ``(input, "image" | "video")`` (repeated with the items of each batch row).
    per_row: tuple[str, ...] = ()
    per_item: tuple[tuple[str, str], ...] = ()
    # Those ``prepare`` leaves on the host when it moves the batch (read there, as the grids are).
    host_only: tuple[str, ...] = ()
    # Grid rows that come as other inputs (the image's, the video's), with ``grids(host) -> (image_grid_thw,
    # video_grid_thw)`` making ``(t, h, w)`` rows of them; the forward is handed the plan's host copies of them.
    grid_inputs: tuple[str, str] | None = None
    grids: Callable | None = None
    # The tokens' spatial merge on a side where the vision config names none: ``merge(config) -> int``.
    merge: Callable | None = None
    # ``tower_grid(spec, host, image_tokens)``: the image grids the tower sees, where they are not all the given ones.
    tower_grid: Callable | None = None
    # ``positions(spec, host) -> dict``: the family's own rotary positions as Plan fields (``position_ids``,
    # ``rope_deltas`` and what else its index leaves), instead of the shared M-RoPE index.
    positions: Callable | None = None
    # ``rope_index(spec, host, mask) -> (position_ids, rope_deltas) | None``: the family's own rotary index
    # (``RotaryIndex.host_class``) computed on the host copies without stock's token-by-token walk, exactly stock's
    # numbers; None where it does not model the batch's layout (the plan then runs stock's own index on the host).
    # One that interleaves audio and video (``RotaryIndex.audio_class``) is also given ``use_audio_in_video=``; the
    # plan's own call gives ``runs=``, the placeholder runs over every position (``token_types.Runs``) it found already,
    # which an index may take rather than find them again.
    rope_index: Callable | None = None
    # ``fields(spec, host) -> dict``: Plan fields the family adds (its audio encoder's plan).
    fields: Callable | None = None
    # The ints of ``Plan.family_counts`` that a stream's graph takes as sizes (``Plan.carriers``: a symbol, not an
    # int it would be specialised on).
    sizes: tuple[str, ...] = ()
    # The traced forward loops over the image items in Python and keeps a tensor per item (a forward that returns one
    # per image): a stream's graph takes each item's height and width as sizes (``VisionPlan.row_carriers``), so it
    # serves every item size, one graph per item count (the number of tensors it returns).
    item_sizes: bool = False
    # ``expand(plan, k) -> dict``: the inputs of a batch generate() expanded ``k`` times, where the shared rule
    # (``batch.expanded_inputs``) does not give them.
    expand: Callable | None = None
    # The config attributes the family's own host rotary index reads (``RotaryIndex.host_class``), beyond the image
    # token, ``mrope_section`` and the merge size: kept in the spec's ``rope_key``.
    rope_config: tuple[str, ...] = ()
    # ``values(config) -> dict``: the config values the family's hooks depend on (kept in ``ModelSpec.values``,
    # checked against the model like the rest of the spec).
    values: Callable | None = None
    # ``feature_words(kind, tokens, features, spec) -> str``: stock's words where placeholders and features disagree,
    # where the family's stock says it otherwise (``spec.value``: a config value its words print, declared in ``values``).
    feature_words: Callable | None = None

    def __post_init__(self):
        declared = set(self.inputs)
        for name in (*self.per_row, *(n for n, _ in self.per_item), *self.host_only, *(self.grid_inputs or ())):
            if name not in declared:
                raise ValueError(f"PlanHooks: {name!r} is not among the declared inputs {self.inputs}")
        if (self.grid_inputs is None) != (self.grids is None):
            raise ValueError("PlanHooks: grid_inputs and grids come together")


def plan_inputs() -> tuple[str, ...]:
    """Every control input a plan is built from: the shared ones, then those the registered families declare
    (``REGISTRY.inputs``, in registration order; ``spec.register_layout`` adds them)."""
    return SHARED_INPUTS + tuple(REGISTRY.inputs)
