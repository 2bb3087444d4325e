"""Models to try syncfree on: presets of published shapes with random weights (nothing is downloaded), tiny
ones for tests, or a local checkpoint folder. The presets live with their families (``syncfree.families``).

    model = build_model("qwen3-vl-2b", text_layers=2)
    processor = build_processor("qwen3-vl-tiny")      # a Qwen-VL processor built offline (images only)
"""

from __future__ import annotations

from .families import PRESETS, Preset
from .families.loading import build_model, build_vision_model, load_config, vision_tower_of
from .families.qwen_vl.processor import build_processor as _build_processor

__all__ = ["PRESETS", "Preset", "load_config", "build_model", "build_vision_model", "vision_tower_of",
           "build_processor"]


def build_processor(model, **options):
    """The family's processor for a Qwen-VL preset name, model or config, built offline (a word-level tokenizer
    with the special tokens at the config's ids, the family's image processor): see
    ``syncfree.families.qwen_vl.processor.build_processor`` for ``options``."""
    config = load_config(model) if isinstance(model, str) else getattr(model, "config", model)
    return _build_processor(config, **options)
