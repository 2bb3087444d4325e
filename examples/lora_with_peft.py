"""LoRA with PEFT on a patched Qwen-VL: adapters on the language model's attention and on the vision tower's, syncfree
applied before or after ``get_peft_model``; forward, ``merge_and_unload`` and a saved-and-loaded adapter all give the
stock model's logits, and the prepared forward makes no sync.

Runs anywhere: the sync check uses syncfree's emulated CUDA device on a CPU-only machine.

    python examples/lora_with_peft.py [qwen3-vl-tiny | qwen2.5-vl-tiny]
"""

from __future__ import annotations

import sys
import tempfile

import torch
from peft import LoraConfig, PeftModel, get_peft_model

import syncfree
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import PRESETS, build_model, load_config

# The language model's attention projections and the vision tower's fused qkv and output projection (the vision
# blocks' attention is ``visual.blocks.N.attn``), by regular expression: PEFT matches the full module name.
TARGETS = r".*(language_model.*\.(q_proj|k_proj|v_proj|o_proj)|visual\.blocks\.\d+\.attn\.(qkv|proj))"


def lora(model):
    """The model with random (not zero) LoRA weights on ``TARGETS``, the same for every call."""
    torch.manual_seed(1)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False))


def batch_for(preset: str) -> dict:
    config = load_config(preset)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    return build_inputs(config, named_layout("mixed", 2 * unit, unit), pad_token_id=PRESETS[preset].pad_token_id)


def logits(model, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def prepared_syncs(model, batch: dict) -> tuple[torch.Tensor, int]:
    """The model's logits from a prepared batch on the emulated device, and the syncs that forward made."""
    with torch.no_grad(), syncfree.emulate_cuda():
        model.to("cuda")
        kwargs = syncfree.prepare(batch, "cuda", model)
        with syncfree.audit() as report:
            out = model(**kwargs).logits
        out = out.to("cpu")
        model.to("cpu")
    return out, len(report.syncs)


def main(preset: str = "qwen3-vl-tiny") -> dict:
    """Every check of the module docstring; returns what each found."""
    batch = batch_for(preset)
    stock = lora(build_model(preset))
    expected = logits(stock, batch)
    adapted = [n for n, _ in stock.named_modules() if n.endswith("lora_A")]
    found = {"adapted": {"vision": sum(".visual." in n for n in adapted), "text": sum(".visual." not in n for n in adapted)}}

    after = syncfree.patch(lora(build_model(preset)))  # patched after get_peft_model
    before = lora(syncfree.patch(build_model(preset)))  # patched before
    for name, model in (("patched after get_peft_model", after), ("patched before get_peft_model", before)):
        out, syncs = prepared_syncs(model, batch)
        found[name] = {"patched": syncfree.is_patched(model), "equal": torch.equal(logits(model, batch), expected),
                       "prepared equal": torch.equal(out, expected), "prepared syncs": syncs}

    merged = after.merge_and_unload()  # a plain model again, patched, with the adapters folded in
    merged_stock = stock.merge_and_unload()
    found["merge_and_unload"] = {"patched": syncfree.is_patched(merged),
                                 "equal": torch.equal(logits(merged, batch), logits(merged_stock, batch))}

    with tempfile.TemporaryDirectory() as folder:
        lora(build_model(preset)).save_pretrained(folder)  # the adapter alone
        loaded = PeftModel.from_pretrained(syncfree.patch(build_model(preset)), folder)
        out, syncs = prepared_syncs(loaded, batch)
        found["saved and loaded adapter"] = {"patched": syncfree.is_patched(loaded),
                                             "equal": torch.equal(logits(loaded, batch), expected),
                                             "prepared syncs": syncs}
    for check, result in found.items():
        print(f"{check}: {result}")
    return found


if __name__ == "__main__":
    main(*sys.argv[1:])
