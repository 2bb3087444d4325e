"""A preset: config values for a random-weight model of published (or tiny test) shapes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Preset"]


@dataclass(frozen=True)
class Preset:
    name: str
    values: dict  # the config's values, model_type included
    pad_token_id: int
    about: str
    # The text model's only attention implementation, where it has one (HY-V4-VL's sink + indexer attention is
    # eager-only): the vision tower still takes the one asked for.
    text_attn: str | None = None
