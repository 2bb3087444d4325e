"""Models to try syncfree on: presets of published shapes with random weights (nothing is downloaded), tiny
ones for tests, or a local checkpoint folder. The presets live with their families (``syncfree.families``).

    model = build_model("qwen3-vl-2b", text_layers=2)
"""

from __future__ import annotations

from .families import PRESETS, Preset
from .families.loading import build_model, build_vision_model, load_config, vision_tower_of

__all__ = ["PRESETS", "Preset", "load_config", "build_model", "build_vision_model", "vision_tower_of"]
