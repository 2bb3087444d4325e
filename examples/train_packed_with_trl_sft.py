"""Fine-tune a tiny Qwen2.5-VL with TRL's ``SFTTrainer`` on padding-free packed batches, and count every step's syncs
by owner.

Runs anywhere: on a CPU-only machine it trains on syncfree's emulated CUDA device (drop ``emulate_cuda()`` on a GPU).
The dataset holds one processor output per sample (batch dim 1, with labels), so TRL's own preparation is skipped
(``skip_prepare_dataset``); ``syncfree.packing_collator`` packs each micro-batch end to end, with each sample's own
positions and the plan holding the boundaries. The model makes no sync; what is left is TRL's metrics in its
``compute_loss`` and Trainer's reads when it logs.

    python examples/train_packed_with_trl_sft.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (client_audit and the Trainer example, beside this file)

from client_audit import SyncsPerStep, trl_torch_kernels  # noqa: E402
from datasets import Dataset  # noqa: E402
from train_packed_with_trainer import dataset  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import syncfree  # noqa: E402
from syncfree.presets import build_model, build_processor  # noqa: E402

PRESET = "qwen2.5-vl-tiny"


def as_dataset(samples: list[dict]) -> Dataset:
    """The samples as the ``datasets.Dataset`` TRL takes (nested lists; a sample without images has None there)."""
    names = sorted({name for s in samples for name in s})
    return Dataset.from_list([{name: s[name].tolist() if name in s else None for name in names} for s in samples])


class AsTensors:
    """The dataset's rows back as processor outputs (tensors, absent inputs left out), then the packing collator."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, rows: list[dict]) -> dict:
        return self.collator([{name: torch.tensor(value, dtype=torch.float32 if name == "pixel_values" else torch.long)
                               for name, value in row.items() if value is not None} for row in rows])


def train(steps: int = 3, verbose: bool = True) -> dict:
    """Train ``steps`` steps of 4 samples packed into rows of at most 64 tokens; returns each step's loss and syncs."""
    model = syncfree.patch(build_model(PRESET, dtype=torch.float32, seed=0))
    callback = SyncsPerStep(verbose=verbose)
    losses = []
    with syncfree.emulate_cuda(), trl_torch_kernels(), tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
                         learning_rate=1e-3, report_to=[], save_strategy="no", dataloader_pin_memory=False,
                         disable_tqdm=True, max_length=None, seed=0, logging_nan_inf_filter=False, bf16=False,
                         remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True})
        trainer = SFTTrainer(model=model, args=args, train_dataset=as_dataset(dataset(model.config)),
                             processing_class=build_processor(PRESET),
                             data_collator=AsTensors(syncfree.packing_collator(model, max_tokens=64)),
                             callbacks=[callback])
        step = trainer.training_step

        def training_step(*a, **kw):  # keep each step's loss as computed (read back after training)
            loss = step(*a, **kw)
            losses.append(loss.detach())
            return loss

        trainer.training_step = training_step
        trainer.train()
        losses = [loss.to("cpu") for loss in losses]
    return {"losses": losses, "steps": callback.steps}


if __name__ == "__main__":
    result = train()
    for s in result["steps"]:
        print(f"step {s['step']}: {s['owners']}")
