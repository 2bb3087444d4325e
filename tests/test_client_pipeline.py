"""``pipeline("image-text-to-text")`` with a patched model (examples/pipeline_image_text_to_text.py): stock's text."""

from __future__ import annotations

import pytest

pytest.importorskip("PIL")

from client_examples import load_example  # noqa: E402


@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_pipeline_generates_stock_text(preset):
    stock, patched = load_example("pipeline_image_text_to_text").main(preset)
    assert len(stock) == 2 and all(stock)
    assert patched == stock
