"""``FamilyGroup``: what a family group's folder declares, as one object (its ``GROUP``), which the registry reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..items import VISUAL_ITEMS
from ..plan.spec import ModelSpec
from ..rewrite.targets import Family
from .preset import Preset

__all__ = ["FamilyGroup"]


@dataclass(frozen=True)
class FamilyGroup:
    """A family group: ``GROUP = FamilyGroup(...)`` in ``syncfree/families/<group>/__init__.py``. Only ``families`` and
    ``build`` have no default."""

    # One ``Family`` per model type this release registers: its targets and its input ``Layout``.
    families: tuple[Family, ...]
    # ``build(config, samples, *, padding_side, seed, pad_token_id) -> dict``: a batch laid out exactly as the family's
    # processor lays it out (``processor_batch``).
    build: Callable
    # Presets by name (a tiny random-weight one per family, ``<name>-tiny``), and how a preset is built: the vision
    # tower's class by model type, and the model's class where no auto class builds it from its config. (Those of a
    # family this release does not register are left out.)
    presets: dict[str, Preset] = field(default_factory=dict)
    vision_classes: dict[str, str] = field(default_factory=dict)
    model_classes: dict[str, Callable] = field(default_factory=dict)
    # Each model type as its authors write it (``Qwen2.5-VL``), for the tables and the docs
    # (``benchmarks/doc_tables/common.py`` reads this literal from the folder's source, whether or not this release
    # registers the family).
    display: dict[str, str] = field(default_factory=dict)
    # The census's config fixes by model type (``census.fixes``): what its shrunk default config needs to build.
    census_fixes: dict[str, Callable] = field(default_factory=dict)
    # The input items its processor takes (``families.processor_batch`` refuses any other in one line).
    items: tuple[type, ...] = VISUAL_ITEMS
    # ``claims(config) -> bool``: the configs whose batches its processors lay out, where that is not "a model type of
    # ``families``".
    claims: Callable | None = None
    # The ``ModelSpec`` ``prepare(batch)`` assumes without a model (one group declares it).
    assumed_spec: ModelSpec | None = None

    def __post_init__(self):
        # Presets and tower classes of the families it registers only: none for a family this release ships older
        # code for (``shared.installed_source_has``), which stays stock.
        own = {f.model_type for f in self.families}
        object.__setattr__(self, "presets", {n: p for n, p in self.presets.items() if p.values["model_type"] in own})
        object.__setattr__(self, "vision_classes", {t: c for t, c in self.vision_classes.items() if t in own})

    def handles(self, config) -> bool:
        """True for a config (or model type) whose batches this group's processors lay out."""
        if self.claims is not None:
            return self.claims(config)
        model_type = config if isinstance(config, str) else getattr(config, "model_type", "")
        return any(f.model_type == model_type for f in self.families)

    def processor_batch(self, config, samples: list[list], *, padding_side: str = "left", seed: int = 0,
                        pad_token_id: int | None = None) -> dict:
        """The processor-style CPU batch for ``samples`` under ``config`` (``build``)."""
        return self.build(config, samples, padding_side=padding_side, seed=seed, pad_token_id=pad_token_id)
