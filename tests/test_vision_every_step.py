"""patch(model, vision_every_step=True) on one process: both tower passes in every training forward, the
numbers of stock, no sync; untouched in inference; refused where it cannot apply."""

from __future__ import annotations

import pytest
import torch

import syncfree
from family_checks import check_vision_every_step
from syncfree.compare.train import labels_for
from syncfree.inputs import Image, Text, processor_batch
from syncfree.patch_registry import installed
from syncfree.presets import PRESETS, build_model, load_config
from syncfree.rewrite.vision_in_step import ATTRIBUTE


def _batch(preset: str, layout: str) -> dict:
    config = load_config(preset)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    samples = {"text-only": [[Text(9)], [Text(5)]], "image": [[Text(2), Image(2 * unit, 2 * unit), Text(3)]]}[layout]
    batch = processor_batch(config, samples, pad_token_id=PRESETS[preset].pad_token_id)
    batch["labels"] = labels_for(batch)
    return batch


def _tower_calls(model) -> list:
    calls = []
    model.model.visual.register_forward_hook(lambda *args: calls.append(1))
    return calls


@pytest.mark.parametrize("layout", ["text-only", "image"])
@pytest.mark.parametrize("preset", ["qwen2.5-vl-tiny", "qwen3-vl-tiny", "qwen3.5-tiny", "exaone4.5-tiny",
                                    "glm4.1v-tiny"])
def test_training_forwards_make_both_tower_passes_with_stock_numbers_and_no_sync(preset, layout):
    check_vision_every_step(preset, _batch(preset, layout))


def test_inference_is_untouched():
    batch = _batch("qwen3-vl-tiny", "text-only")
    model = build_model("qwen3-vl-tiny", dtype=torch.float32, seed=0).eval()
    syncfree.patch(model, vision_every_step=True)
    calls = _tower_calls(model)
    with torch.no_grad():
        model(**batch)
    model.train()
    with torch.no_grad():  # no gradients: nothing to keep in step
        model(**batch)
    assert calls == []


def test_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="applies to a model instance"):
        syncfree.patch(vision_every_step=True)


@pytest.mark.parametrize("preset", sorted(n for n in PRESETS if n.endswith("-tiny")))
def test_every_tiny_preset_either_takes_it_or_refuses_it(preset):
    """Never a silent no-op: a family whose tower the one-unit pass would not reach is refused, untouched; one whose
    projector sits outside its tower (``TowerShape.holds_projector``) is refused with that reason."""
    family = syncfree.families.FAMILIES.get(PRESETS[preset].values["model_type"])
    if family is None or not installed(family.modeling):
        pytest.skip(f"this Transformers release has no {preset} syncfree supports")
    model = build_model(preset)
    projector_outside = getattr(model.config, "vision_config", None) is not None and not family.layout.tower.holds_projector
    try:
        syncfree.patch(model, vision_every_step=True)
    except ValueError as refusal:
        assert "vision_every_step=True does not support" in str(refusal)
        assert not projector_outside or "projector sits outside the vision tower" in str(refusal)
        assert not syncfree.is_patched(model)
    else:
        assert not projector_outside, f"{preset}: its projector sits outside the tower, yet it was patched"
        assert any(m.__dict__.get(ATTRIBUTE) for m in model.modules())


def test_an_audio_model_is_refused_for_having_no_vision_tower():
    family = syncfree.families.FAMILIES.get("qwen3_asr")
    if family is None or not installed(family.modeling):
        pytest.skip("this Transformers release has no Qwen3-ASR syncfree supports")
    model = build_model("qwen3-asr-tiny")
    with pytest.raises(ValueError, match="does not support qwen3_asr .an audio model: it has no vision tower"):
        syncfree.patch(model, vision_every_step=True)
    assert not syncfree.is_patched(model)
