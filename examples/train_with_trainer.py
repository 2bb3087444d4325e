"""Train a tiny Qwen3-VL for a few steps with Hugging Face ``Trainer``, patched, and count syncs per step.

Runs anywhere: on a CPU-only machine the model trains on syncfree's emulated CUDA device (drop
``emulate_cuda()`` on a GPU). The plan is built in the data collator (``syncfree.planning_collator``),
the way it would be built in ``DataLoader`` workers; Trainer moves the batch as it always does and the
patched model takes the plan along. Each step's syncs are listed by phase; at ``logging_steps`` the
Trainer reads the loss and the gradient norm back itself, and those reads are named as its own.

    python examples/train_with_trainer.py
"""

from __future__ import annotations

import tempfile

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import syncfree
from syncfree.compare.train import labels_for
from syncfree.inputs import Image, Text, Video, build_inputs
from syncfree.presets import PRESETS, build_model

PRESET = "qwen3-vl-tiny"
# Each example is one request as the processor would lay it out (random pixels, token layout exact).
EXAMPLES = [[Text(3), Image(64, 64), Text(2)], [Text(4), Video(2, 64, 32), Text(1)], [Image(32, 32), Text(5)],
            [Text(7)], [Text(2), Image(32, 64), Text(3)], [Video(2, 32, 32), Text(4)]] * 2


class Collate:
    """A user's collator: a list of examples in, the processor's batch (with labels) out."""

    def __init__(self, config):
        self.config = config

    def __call__(self, examples):
        batch = build_inputs(self.config, examples, pad_token_id=PRESETS[PRESET].pad_token_id)
        batch["labels"] = labels_for(batch)
        return batch


def _statement(where, most: int = 80) -> str:
    """The statement at a sync's line, its continuation lines joined (a line alone may be only ``if (``)."""
    import linecache

    text, lineno = where.code.strip(), where.lineno
    while text.count("(") + text.count("[") > text.count(")") + text.count("]") and len(text) < most:
        lineno += 1
        more = linecache.getline(where.filename, lineno).strip()
        if not more:
            break
        text += " " + more
    return text if len(text) <= most else text[:most - 3] + "..."


class SyncsPerStep(TrainerCallback):
    """Audits each step from its start to the next one's (forward, backward, optimizer, and the Trainer's
    logging after it), and prints its syncs by phase with the lines that made them."""

    def __init__(self):
        self.audit = None
        self.steps = []

    def _close(self, step: int) -> None:
        if self.audit is None:
            return
        report = self.audit.__exit__(None, None, None) or self.report
        phases = {p: n["syncs"] for p, n in report.by_phase().items()}
        lines = sorted({f"{e.line} ({e.where.function}: {_statement(e.where)})" for e in report.syncs})
        self.steps.append({"step": step, "phases": phases, "lines": lines})
        print(f"step {step}: {sum(phases.values())} syncs {phases}")
        for line in lines:
            print(f"    {line}")
        self.audit = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._close(state.global_step)
        self.audit = syncfree.audit()
        self.report = self.audit.__enter__()

    def on_train_end(self, args, state, control, **kwargs):
        self._close(state.global_step)


def main(nan_inf_filter: bool = True) -> list[dict]:
    """Train 4 steps; returns each step's syncs by phase and the lines that made them.

    ``nan_inf_filter``: Trainer's ``logging_nan_inf_filter`` (on by default), which checks every step's
    loss on the host (two syncs per step, Trainer's own)."""
    model = build_model(PRESET, dtype=torch.float32, seed=0)
    callback = SyncsPerStep()
    with syncfree.emulate_cuda(), tempfile.TemporaryDirectory() as out:
        syncfree.patch(model)
        args = TrainingArguments(output_dir=out, max_steps=4, per_device_train_batch_size=2, logging_steps=2,
                                 learning_rate=1e-3, report_to=[], save_strategy="no", dataloader_pin_memory=False,
                                 remove_unused_columns=False, disable_tqdm=True,
                                 logging_nan_inf_filter=nan_inf_filter)
        trainer = Trainer(model=model, args=args, train_dataset=EXAMPLES, callbacks=[callback],
                          data_collator=syncfree.planning_collator(Collate(model.config), model))
        trainer.train()
    return callback.steps


if __name__ == "__main__":
    main()
    print("\nwithout Trainer's per-step NaN/Inf check of the loss (logging_nan_inf_filter=False):")
    main(nan_inf_filter=False)
