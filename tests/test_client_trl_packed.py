"""TRL's ``SFTTrainer`` on packed batches (examples/train_packed_with_trl_sft.py): the model makes no sync; what is left
is TRL's metrics and Trainer's logging."""

from __future__ import annotations

import pytest

pytest.importorskip("trl", reason="TRL is not installed (pip install 'trl>=1.16')")

from client_examples import load_example  # noqa: E402


@pytest.mark.slow
def test_sft_trainer_trains_packed_batches_with_no_sync_of_the_model():
    result = load_example("train_packed_with_trl_sft").train(steps=2, verbose=False)
    assert len(result["steps"]) == 2 and all(loss.isfinite() for loss in result["losses"])
    for step in result["steps"]:
        assert set(step["owners"]) <= {"trl", "trainer"}, step
        assert step["phases"]["forward"] == step["phases"]["backward"] == 0, step
