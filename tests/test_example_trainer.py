"""examples/train_with_trainer.py: HF Trainer trains a patched model, planned in its collator, without a
sync of syncfree's or the model's; the only reads left are Trainer's own logging, named as such."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# HF Trainer needs accelerate (peft, in the test extra, brings it).
pytest.importorskip("accelerate", reason='HF Trainer needs accelerate: pip install -e ".[test]"')

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_with_trainer.py"
TRAINER_LOGGING = ("_maybe_log_save_evaluate", "_finalize_training")


@pytest.mark.slow
def test_trainer_steps_sync_only_in_trainer_logging():
    spec = importlib.util.spec_from_file_location("train_with_trainer", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    steps = example.main(nan_inf_filter=False)
    assert len(steps) == 4
    for step in steps:
        for line in step["lines"]:  # every read left is Trainer's logging (at logging_steps and at the end)
            assert line.startswith("transformers/trainer.py:") and line.split("(")[1].split(":")[0] in TRAINER_LOGGING
    assert [sum(s["phases"].values()) == 0 for s in steps] == [True, False, True, False]  # logging_steps=2
    # ... and booked as the trainer's own, not the forward's
    assert all(s["phases"]["trainer"] == sum(s["phases"].values()) for s in steps)
    # the statement each line shows is whole (a line of a multi-line statement alone may read "if (")
    statements = [line.split(": ", 1)[1][:-1] for s in steps for line in s["lines"]]  # ("file:line (function: ...)")
    assert all(st.count("(") <= st.count(")") or st.endswith("...") for st in statements), statements


PACKED = Path(__file__).resolve().parent.parent / "examples" / "train_packed_with_trainer.py"


def test_trainer_trains_packed_batches_without_a_sync_of_the_model():
    spec = importlib.util.spec_from_file_location("train_packed_with_trainer", PACKED)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    steps = example.main(steps=3)
    assert len(steps) == 3
    for step in steps:  # forward, backward, optimizer: none; what is left is Trainer's logging at the last step
        assert all(line.startswith("transformers/trainer.py:") for line in step["lines"]), step
    assert [sum(s["phases"].values()) for s in steps[:2]] == [0, 0]
