"""syncfree.presets.build_processor: the family's processor built offline, laying a chat out as the model expects."""

from __future__ import annotations

import pytest
import torch

import syncfree
from syncfree.presets import build_model, build_processor, load_config

pytest.importorskip("PIL")

from client_examples import load_example  # noqa: E402

PRESETS = ("qwen3-vl-tiny", "qwen2.5-vl-tiny", "qwen2-vl-tiny")


def _chat(question: str, image: bool) -> list:
    return [{"role": "user", "content": ([{"type": "image"}] if image else []) + [{"type": "text", "text": question}]}]


@pytest.mark.parametrize("preset", PRESETS)
def test_processor_expands_each_image_to_its_merged_patches_at_the_config_ids(preset):
    config = load_config(preset)
    processor = build_processor(preset)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    image = load_example("client_audit").random_image(2 * unit, 3 * unit, seed=0)
    text = processor.apply_chat_template([_chat("what is in the image", True), _chat("describe a cat", False)],
                                         add_generation_prompt=True, tokenize=False)
    batch = processor(text=text, images=[[image], []], padding=True, return_tensors="pt")
    merge = config.vision_config.spatial_merge_size
    assert batch["image_grid_thw"].tolist() == [[1, 2 * merge, 3 * merge]]
    ids = batch["input_ids"]
    assert int((ids == config.image_token_id).sum()) == 6  # 2 x 3 merged patches
    assert int((ids[0] == config.vision_start_token_id).sum()) == int((ids[0] == config.vision_end_token_id).sum()) == 1
    assert torch.equal(batch["mm_token_type_ids"], (ids == config.image_token_id).long())
    assert batch["attention_mask"][1, 0] == 0  # padded on the left, as for generation
    syncfree.prepare(batch, None, config)  # syncfree's checks of a processor batch pass
    with torch.no_grad():
        assert build_model(preset)(**batch).logits.shape == (*ids.shape, config.text_config.vocab_size)


def test_every_token_id_decodes_and_words_round_trip():
    processor = build_processor("qwen3-vl-tiny")
    size = load_config("qwen3-vl-tiny").text_config.vocab_size
    assert len(processor.tokenizer) == size
    ids = processor.tokenizer("describe the picture", add_special_tokens=False)["input_ids"]
    assert processor.decode(ids) == "describe the picture"


def test_a_family_without_a_qwen_vl_processor_is_refused():
    with pytest.raises(ValueError, match=r"build_processor builds Qwen-VL processors .* not 'glm4v'"):
        build_processor(load_config("glm4.1v-tiny"))
