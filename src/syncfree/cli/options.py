"""Every command's options, declared without importing torch or Transformers: ``syncfree --help`` and ``syncfree
COMMAND --help`` answer in a fraction of a second. The names they offer are literals (``names``), the checks of
their values light functions (``compare.checks``); each command imports its work only when it runs."""

from __future__ import annotations

import argparse

from ..compare.checks import ATTNS, at_least_one, positive_seconds
from ..compare.outputs import bench_out, census_out
from .names import INPUT_KINDS, VISION_BACKENDS

__all__ = ["add_audit_args", "add_bench_args", "add_census_args", "add_patch_args", "add_doctor_args",
           "add_presets_args"]


def add_audit_args(p: argparse.ArgumentParser, model: str, inputs: str, text_layers: int | None,
                   dtypes: dict) -> None:
    """``demo``'s and ``audit``'s options."""
    p.add_argument("--model", default=model,
                   help=f"a preset (`syncfree presets` lists them) or a local checkpoint folder (default: {model})")
    p.add_argument("--inputs", default=inputs, choices=INPUT_KINDS,
                   help=f"input kind (default: {inputs}); audio and audio-in-video for Omni thinkers")
    p.add_argument("--attn", default="sdpa",
                   help=f"attention implementation: {', '.join(ATTNS)} (flash_attention_2 needs flash-attn; varlen, "
                        "PyTorch's flash kernel in the vision tower, a CUDA GPU and bf16/fp16) (default: sdpa)")
    p.add_argument("--scope", default="full", choices=("vision", "rope", "full"),
                   help="what to run: the vision tower, the rope index, or the whole prefill (default: full)")
    p.add_argument("--text-layers", type=at_least_one, default=text_layers,
                   help="shorten the text model to N layers (widths stay real); default: "
                   + ("all" if text_layers is None else str(text_layers)))
    p.add_argument("--dtype", default="float32", choices=sorted(dtypes), help="model dtype (default: float32)")
    p.add_argument("--image-side", type=int, default=None,
                   help="image side in pixels, a multiple of patch x merge size (32 for Qwen3-VL, 28 for "
                        "Qwen2/2.5-VL); default: 448, or two of those units for a tiny preset")
    p.add_argument("--engine", default="auto", choices=("auto", "emulated", "cuda"),
                   help="auto: the real GPU if there is one, else the emulated device")
    p.add_argument("--vision-attention", default="split", choices=VISION_BACKENDS,
                   help="how the patched vision attention runs its segments: split (as stock), grouped, "
                        "block_diagonal, varlen (a real GPU, bf16/fp16) or auto (default: split)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    if p.prog.endswith("audit"):
        p.add_argument("--compare", action="store_true",
                       help="audit stock and syncfree-patched forwards side by side")
        p.add_argument("--train", action="store_true",
                       help="audit one training step instead of a forward (forward with labels, backward, AdamW "
                            "step, zero_grad), stock and patched side by side, by phase")
        p.add_argument("--grad-ckpt", choices=("reentrant", "non-reentrant"), default=None,
                       help="with --train: gradient checkpointing, as Transformers enables it")
        p.add_argument("--optimizer", choices=("adamw", "sgd"), default=None,
                       help="with --train: adamw (default) or sgd (no optimizer state: for large shapes)")


def add_bench_args(bench: argparse.ArgumentParser, dtypes: dict) -> None:
    """``bench``'s options."""
    bench.add_argument("--quick", action="store_true",
                       help="tiny models and reduced inputs: a smoke run of under a minute (timings are not a "
                            "measurement); explicit options below still apply")
    bench.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    bench.add_argument("--models", nargs="+", help="presets or checkpoint folders (default: the real shapes; "
                                                    "with --quick the tiny ones)")
    bench.add_argument("--scenarios", nargs="+", help="scenario names (default: all)")
    bench.add_argument("--attn", nargs="+",
                       help="attention implementations: sdpa, eager, flash_attention_2 (when installed), or varlen "
                            "(PyTorch's flash kernel for the vision tower, CUDA only); default: sdpa, and sdpa and "
                            "eager on cuda (sdpa with --quick)")
    bench.add_argument("--vision-attention", default="split", choices=VISION_BACKENDS,
                       help="how the patched vision attention runs its segments: split (as stock), grouped, "
                            "block_diagonal, varlen (CUDA, bf16/fp16) or auto (default: split)")
    bench.add_argument("--compile", action="store_true",
                       help="also time compiled forwards: the vision tower (vision scope), the whole model (full, "
                            "train: patched and prepared as one graph where the family traces whole, stock as "
                            "Transformers does)")
    bench.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune"), default=None,
                       help="with --compile: torch.compile's mode (reduce-overhead: CUDA graphs on a GPU)")
    bench.add_argument("--scopes", nargs="+", default=["vision", "full"], choices=("vision", "full", "train"),
                       help="vision tower alone, the full prefill, and/or a training step (forward with labels, "
                            "backward, optimizer step; syncs also by phase) (default: vision full)")
    bench.add_argument("--dtype", choices=sorted(dtypes), help="model dtype (default float32)")
    bench.add_argument("--repeats", type=at_least_one, help="timed runs per variant (default 5; 2 with --quick)")
    bench.add_argument("--budget", type=positive_seconds,
                       help="seconds per variant before repeats are cut (default 20; 1 with --quick)")
    bench.add_argument("--text-layers", type=at_least_one, help="text layers for the full scope (default 2)")
    bench.add_argument("--out", help=f"output folder (default {bench_out(quick=False)}; with --quick {bench_out(quick=True)})")
    bench.add_argument("--name", help="file name stem (default bench-<device>[-quick])")
    bench.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    bench.add_argument("--no-graph-breaks", action="store_true",
                       help="skip counting the vision tower's graph breaks (torch._dynamo.explain)")
    bench.add_argument("--deadline", type=positive_seconds, metavar="SECONDS",
                       help="start no new scenario after this many seconds; the rest are listed as not run")
    bench.add_argument("--keep-going", action="store_true",
                       help="record a failing scenario and go on (the exit status is then 1)")


def add_census_args(p: argparse.ArgumentParser) -> None:
    """``census``'s options."""
    p.add_argument("--families", nargs="+", metavar="MODEL_TYPE",
                   help="model types to run (default: every family found in the installed Transformers)")
    p.add_argument("--out", default=None,
                   help=f"output folder for census.json, census.csv and census.png (default: {census_out()})")
    p.add_argument("--name", default="census", help="file name stem (default: census)")
    p.add_argument("--no-graph-breaks", action="store_true",
                   help="skip counting the whole forward's graph breaks (torch._dynamo.explain, the slowest part)")


def add_patch_args(p: argparse.ArgumentParser, dtypes: dict) -> None:
    """``patch``'s options."""
    p.add_argument("--report", action="store_true",
                   help="say what syncfree.patch rewrites in the model and audit what it leaves (the command's one job)")
    p.add_argument("--model", required=True,
                   help="a preset, a local checkpoint folder, or a model type of the installed Transformers with the "
                        "packed vision split (e.g. kimi_k25: a tiny one is built from its config)")
    p.add_argument("--inputs", default="images", choices=("image", "images", "video", "mixed"),
                   help="input kind for a preset or checkpoint (default: images); a model type gets two images")
    p.add_argument("--dtype", default="float32", choices=sorted(dtypes), help="default: float32")
    p.add_argument("--text-layers", type=int, default=None, help="shorten the text model of a large preset to N layers")


def add_doctor_args(p: argparse.ArgumentParser) -> None:
    """``doctor``'s options."""
    p.add_argument("--families", nargs="+", metavar="MODEL_TYPE",
                   help="only these model types (default: every family syncfree knows or finds)")


def add_presets_args(p: argparse.ArgumentParser) -> None:
    """``presets``' options."""
    p.add_argument("--tiny", action="store_true", help="only the tiny presets (one per family, for tests)")
