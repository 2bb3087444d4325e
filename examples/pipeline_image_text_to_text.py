"""``pipeline("image-text-to-text")`` with a patched tiny Qwen-VL: the same generated text as the stock model.

The pipeline runs the processor, ``model.generate`` and the decoding itself; nothing in it needs to know about
syncfree (without ``prepare()`` the patched model reads the small control tensors once per call, see the docs).

    python examples/pipeline_image_text_to_text.py [qwen3-vl-tiny | qwen2.5-vl-tiny]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (client_audit, beside this file)

from client_audit import random_image  # noqa: E402
from transformers import pipeline  # noqa: E402

import syncfree  # noqa: E402
from syncfree.presets import build_model, build_processor  # noqa: E402


def chats(unit: int) -> list:
    """Two chats, each about one random image (sizes in multiples of ``unit`` pixels)."""
    return [[{"role": "user", "content": [{"type": "image", "image": random_image(2 * unit, 3 * unit, seed=0)},
                                          {"type": "text", "text": "describe the picture"}]}],
            [{"role": "user", "content": [{"type": "image", "image": random_image(unit, unit, seed=1)},
                                          {"type": "text", "text": "what is in the image"}]}]]


def generate(preset: str, patched: bool) -> list[str]:
    model = build_model(preset, seed=0)
    if patched:
        syncfree.patch(model)
    processor = build_processor(preset)
    unit = model.config.vision_config.patch_size * model.config.vision_config.spatial_merge_size
    pipe = pipeline("image-text-to-text", model=model, processor=processor)
    out = pipe(text=chats(unit), max_new_tokens=6, do_sample=False, return_full_text=False)
    return [o[0]["generated_text"] for o in out]


def main(preset: str = "qwen3-vl-tiny") -> tuple[list[str], list[str]]:
    stock, patched = generate(preset, False), generate(preset, True)
    print(f"stock:   {stock}\npatched: {patched}\nequal: {stock == patched}")
    return stock, patched


if __name__ == "__main__":
    main(*sys.argv[1:])
