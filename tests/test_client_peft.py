"""PEFT LoRA on a patched model (examples/lora_with_peft.py): adapters on the language model's and the vision tower's
attention, syncfree applied before or after ``get_peft_model``, merged, saved and loaded; stock's logits throughout
and no sync in a prepared forward."""

from __future__ import annotations

import pytest
import torch

import syncfree
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import build_model

pytest.importorskip("peft")

from client_examples import load_example  # noqa: E402


def test_peft_wrapped_model_is_patched_and_stays_sync_free():
    from peft import LoraConfig, get_peft_model

    from syncfree.audit import assert_no_sync, emulate_cuda

    def lora(model):
        torch.manual_seed(1)
        return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))

    stock, patched = lora(build_model("qwen3-vl-tiny")), syncfree.patch(lora(build_model("qwen3-vl-tiny")))
    assert syncfree.is_patched(patched)
    batch = build_inputs(stock.config, named_layout("mixed", 64))
    with torch.no_grad():
        expected = stock(**batch).logits
        with emulate_cuda():
            patched.to("cuda")
            kwargs = syncfree.prepare(batch, "cuda", patched)
            with assert_no_sync():
                logits = patched(**kwargs).logits
            assert torch.equal(logits.cpu(), expected)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_lora_on_text_and_vision_attention_patched_before_or_after_equals_stock(preset):
    found = load_example("lora_with_peft").main(preset)
    assert found["adapted"]["vision"] > 0 and found["adapted"]["text"] > 0  # both towers carry adapters
    for order in ("patched after get_peft_model", "patched before get_peft_model"):
        assert found[order] == {"patched": True, "equal": True, "prepared equal": True, "prepared syncs": 0}, order
    assert found["merge_and_unload"] == {"patched": True, "equal": True}
    assert found["saved and loaded adapter"] == {"patched": True, "equal": True, "prepared syncs": 0}
