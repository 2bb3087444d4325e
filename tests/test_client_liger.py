"""Liger-Kernel and syncfree composed in either order (examples/liger_with_syncfree.py): Liger's forward and its
rotary kernels stay in force, syncfree's plan reaches the patched model through Liger's forward, logits and loss
equal stock, and a prepared forward makes no sync. (Liger's Triton kernels themselves need a GPU:
benchmarks/gpu/liger_syncfree.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("liger_kernel")

from client_examples import load_example  # noqa: E402


@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_liger_and_syncfree_compose_in_either_order(preset):
    example = load_example("liger_with_syncfree")
    from syncfree.presets import load_config

    reason = example.liger_unavailable(load_config(preset).model_type)
    if reason:
        pytest.skip(reason)
    found = example.main(preset)
    for order in ("liger first", "syncfree first"):
        replaced = found[order].pop("rotary functions Liger replaced")
        assert found[order] == {"liger forward": True, "syncfree patched": True, "logits equal": True,
                                "loss equal": True, "prepared syncs": 0, "seen by syncfree's rewrites": True}, order
        if preset.startswith("qwen3"):  # (Qwen3-VL: the text's and the vision tower's rotary functions)
            assert replaced == ["apply_rotary_pos_emb", "apply_rotary_pos_emb_vision"]


def test_the_example_exits_nonzero_where_liger_cannot_run():
    """Where the installed Liger-Kernel cannot patch the model, the example prints why and exits 2, not 0."""
    import subprocess
    import sys
    from pathlib import Path

    from syncfree.presets import load_config

    example = load_example("liger_with_syncfree")
    reason = example.liger_unavailable(load_config("qwen3-vl-tiny").model_type)
    path = Path(__file__).parents[1] / "examples" / "liger_with_syncfree.py"
    run = subprocess.run([sys.executable, str(path), "qwen3-vl-tiny"], capture_output=True, text=True, timeout=600)
    assert run.returncode == (2 if reason else 0), run.stdout[-500:] + run.stderr[-500:]
    if reason:
        assert reason in run.stdout
