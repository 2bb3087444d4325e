"""Train a tiny Qwen2.5-VL on padding-free packed batches with Hugging Face ``Trainer``, and count syncs per step.

Runs anywhere: on a CPU-only machine the model trains on syncfree's emulated CUDA device (drop ``emulate_cuda()``
on a GPU). The dataset yields one processor output per sample (batch dim 1, with labels); ``syncfree.packing_collator``
packs each micro-batch's samples end to end into rows of at most ``max_tokens`` tokens, with each sample's own
positions and the plan holding the samples' boundaries. Trainer moves the batch as it always does; the patched model
takes the plan along and keeps the samples apart. The forward and backward make no sync; what is left per step is
Trainer's own reads (its NaN/Inf check of the loss, off here, and the loss and gradient norm when it logs).

    python examples/train_packed_with_trainer.py
"""

from __future__ import annotations

import tempfile

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import syncfree
from syncfree.families import processor_batch
from syncfree.inputs import Image, Text, Video
from syncfree.presets import build_model

PRESET = "qwen2.5-vl-tiny"
# One request per sample, of varied length (image sides: multiples of 28 px, patch 14 x merge 2).
EXAMPLES = [[Text(12), Image(56, 56), Text(5)], [Text(30)], [Text(4), Image(28, 84), Text(9), Image(28, 28), Text(2)],
            [Text(6), Video(4, 56, 28), Text(3)], [Text(17)], [Text(3), Image(84, 28), Text(20)]] * 2


def dataset(config) -> list[dict]:
    """Each sample as its processor returns it alone (batch dim 1), with labels."""
    samples = []
    for i, example in enumerate(EXAMPLES):
        sample = processor_batch(config, [example], seed=i)
        sample["labels"] = sample["input_ids"].clone()
        samples.append(sample)
    return samples


class Unbatched(torch.utils.data.Dataset):
    """The samples, handed to the collator as they are (Trainer's default collator would stack them)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


class SyncsPerStep(TrainerCallback):
    """Audits each step (forward, backward, optimizer, and Trainer's logging after it), and prints its syncs."""

    def __init__(self):
        self.audit, self.steps = None, []

    def _close(self, step: int) -> None:
        if self.audit is None:
            return
        self.audit.__exit__(None, None, None)
        phases = {p: n["syncs"] for p, n in self.report.by_phase().items()}
        lines = sorted({e.line for e in self.report.syncs})
        self.steps.append({"step": step, "phases": phases, "lines": lines})
        print(f"step {step}: {sum(phases.values())} syncs {phases} {lines}")
        self.audit = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._close(state.global_step)
        self.audit = syncfree.audit()
        self.report = self.audit.__enter__()

    def on_train_end(self, args, state, control, **kwargs):
        self._close(state.global_step)


def main(steps: int = 3) -> list[dict]:
    """Train ``steps`` steps of 4 samples each, packed into rows of at most 64 tokens; returns each step's syncs."""
    model = syncfree.patch(build_model(PRESET, dtype=torch.float32, seed=0))
    callback = SyncsPerStep()
    collator = syncfree.packing_collator(model, max_tokens=64)
    with syncfree.emulate_cuda(), tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=4, logging_steps=steps,
                                 learning_rate=1e-3, report_to=[], save_strategy="no", dataloader_pin_memory=False,
                                 remove_unused_columns=False, disable_tqdm=True, logging_nan_inf_filter=False)
        trainer = Trainer(model=model, args=args, train_dataset=Unbatched(dataset(model.config)), callbacks=[callback],
                          data_collator=collator)
        trainer.train()
    return callback.steps


if __name__ == "__main__":
    main()
