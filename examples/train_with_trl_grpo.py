"""GRPO on a tiny Qwen-VL with TRL's ``GRPOTrainer`` (rollouts by ``model.generate``), stock and patched, and every
step's syncs by owner.

Runs anywhere: on a CPU-only machine both runs train on syncfree's emulated CUDA device (drop ``emulate_cuda()`` on
a GPU). Both runs draw the same samples from the same seed: completions, losses and the trained weights are equal.
The patched run uses ``syncfree.planning_trainer(GRPOTrainer)``: every batch the trainer moves to the device (the
rollouts' prompts, the processor's inputs of the loss batch) is planned on the host first, and its grids stay there;
each loss batch carries host copies of its tokens, from which its loss forward is planned. What is left is the
generation loop's and TRL's own.

    python examples/train_with_trl_grpo.py [qwen3-vl-tiny | qwen2.5-vl-tiny]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (client_audit, beside this file)

from client_audit import SyncsPerStep, chat_dataset, trl_torch_kernels  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import syncfree  # noqa: E402
from syncfree.presets import build_model, build_processor  # noqa: E402


def reward_letters(completions, **kwargs) -> list[float]:
    """A reward that needs no model and differs between completions: the letters of the answer, mod 7."""
    return [float(sum(map(ord, c[0]["content"])) % 7) for c in completions]


def train(preset: str = "qwen3-vl-tiny", patched: bool = True, steps: int = 2, verbose: bool = True,
          **config) -> dict:
    """Train ``steps`` steps (2 prompts x 2 generations a step; ``config``: more ``GRPOConfig`` values); returns the
    completions, losses, trained weights and syncs."""
    model = build_model(preset, dtype=torch.float32, seed=0)
    processor = build_processor(preset)
    unit = model.config.vision_config.patch_size * model.config.vision_config.spatial_merge_size
    callback = SyncsPerStep(verbose=verbose)
    losses, completions = [], []
    with syncfree.emulate_cuda(), trl_torch_kernels(), tempfile.TemporaryDirectory() as out:
        trainer_class = GRPOTrainer
        if patched:
            syncfree.patch(model)
            # Plans each batch GRPOTrainer moves to the device: its rollouts' prompts, the processor's loss inputs.
            trainer_class = syncfree.planning_trainer(GRPOTrainer)
        args = GRPOConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=4, num_generations=2,
                          max_completion_length=4, logging_steps=1, learning_rate=1e-3, report_to=[],
                          save_strategy="no", dataloader_pin_memory=False, disable_tqdm=True, seed=0, bf16=False,
                          logging_nan_inf_filter=False, **config)
        dataset = chat_dataset(unit, 2 * steps, with_answers=False, text_only_every=0)
        trainer = trainer_class(model=model, reward_funcs=reward_letters, args=args, processing_class=processor,
                                train_dataset=dataset, callbacks=[callback])
        step, prepare = trainer.training_step, trainer._prepare_inputs

        def training_step(*a, **kw):  # keep each step's loss (read back after training)
            loss = step(*a, **kw)
            losses.append(loss.detach())
            return loss

        def prepare_inputs(*a, **kw):  # and the completions each step trains on
            inputs = prepare(*a, **kw)
            completions.append(inputs["completion_ids"])
            return inputs

        trainer.training_step, trainer._prepare_inputs = training_step, prepare_inputs
        trainer.train()
        losses = [loss.to("cpu") for loss in losses]
        completions = [c.to("cpu") for c in completions]
        weights = {name: p.detach().to("cpu") for name, p in model.named_parameters()}
    return {"losses": losses, "completions": completions, "weights": weights, "steps": callback.steps}


def main(preset: str = "qwen3-vl-tiny") -> None:
    print(f"--- stock {preset}")
    stock = train(preset, patched=False)
    print(f"--- patched {preset}")
    patched = train(preset, patched=True)
    same = all(torch.equal(a, b) for a, b in zip(stock["completions"], patched["completions"]))
    equal = all(torch.equal(a, b) for a, b in zip(stock["losses"], patched["losses"]))
    trained = all(torch.equal(w, patched["weights"][n]) for n, w in stock["weights"].items())
    print(f"completions equal: {same}  losses equal: {equal}  weights after training equal: {trained}")
    for s, p in zip(stock["steps"], patched["steps"]):
        print(f"step {s['step']}: stock {s['owners']} -> patched {p['owners']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
