"""Fine-tune a tiny Qwen-VL on an image-and-text chat dataset with TRL's ``SFTTrainer``, stock and patched, and
count every step's syncs by owner.

Runs anywhere: on a CPU-only machine both runs train on syncfree's emulated CUDA device (drop ``emulate_cuda()``
on a GPU). The patched run wraps TRL's own vision collator in ``syncfree.planning_collator``, so each batch
carries its plan from the collator on; Trainer moves the batch, the patched model takes the plan along. The
losses of the two runs are equal, step for step. What is left is the client's: TRL's ``compute_loss`` reads its
metrics back (entropy, token accuracy, token count) and Trainer reads the loss when it logs.

    python examples/train_with_trl_sft.py [qwen3-vl-tiny | qwen2.5-vl-tiny]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (client_audit, beside this file)

from client_audit import SyncsPerStep, chat_dataset, trl_torch_kernels  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling  # noqa: E402

import syncfree  # noqa: E402
from syncfree.presets import build_model, build_processor  # noqa: E402


def train(preset: str = "qwen3-vl-tiny", patched: bool = True, steps: int = 4, verbose: bool = True,
          nan_inf_filter: bool = False) -> dict:
    """Train ``steps`` steps (batch 2, one log per step); returns each step's loss and its syncs by owner."""
    model = build_model(preset, dtype=torch.float32, seed=0)
    processor = build_processor(preset)
    unit = model.config.vision_config.patch_size * model.config.vision_config.spatial_merge_size
    collator = DataCollatorForVisionLanguageModeling(processor)
    callback = SyncsPerStep(verbose=verbose)
    losses = []
    with syncfree.emulate_cuda(), trl_torch_kernels(), tempfile.TemporaryDirectory() as out:
        if patched:
            syncfree.patch(model)
            collator = syncfree.planning_collator(collator, model)  # the plan is made where the batch is made
        args = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=2, logging_steps=1,
                         learning_rate=1e-3, report_to=[], save_strategy="no", dataloader_pin_memory=False,
                         disable_tqdm=True, max_length=None, seed=0, logging_nan_inf_filter=nan_inf_filter,
                         bf16=False)  # (float32: autocast is not emulated)
        trainer = SFTTrainer(model=model, args=args, train_dataset=chat_dataset(unit, 2 * steps),
                             processing_class=processor, data_collator=collator, callbacks=[callback])
        step = trainer.training_step

        def training_step(*a, **kw):  # keep each step's loss as computed (read back after training)
            loss = step(*a, **kw)
            losses.append(loss.detach())
            return loss

        trainer.training_step = training_step
        trainer.train()
        losses = [loss.to("cpu") for loss in losses]
    return {"losses": losses, "steps": callback.steps}


def main(preset: str = "qwen3-vl-tiny") -> None:
    print(f"--- stock {preset}")
    stock = train(preset, patched=False)
    print(f"--- patched {preset}, planned in TRL's collator")
    patched = train(preset, patched=True)
    equal = all(torch.equal(a, b) for a, b in zip(stock["losses"], patched["losses"]))
    print(f"losses equal: {equal}  stock {[round(x.item(), 6) for x in stock['losses']]}")
    for s, p in zip(stock["steps"], patched["steps"]):
        print(f"step {s['step']}: stock {s['owners']} -> patched {p['owners']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
