"""``syncfree bench``: its options, their checks, and what it prints.

Every option is honoured in both modes: ``--quick`` only changes the defaults (tiny models,
reduced inputs, two repeats, a one-second budget, results outside the checkout), so the
numeric options default to ``None`` here and each mode fills in its own value.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from ..compare.outputs import bench_out

__all__ = ["run_bench", "quick_out", "FULL_OUT"]

# Where a run writes without --out (``compare.outputs``: the temp folder, never the checkout's tracked results).
FULL_OUT = bench_out(quick=False)


def quick_out() -> str:
    """Where ``--quick`` writes by default."""
    return bench_out(quick=True)

# (defaults of the full run, defaults of --quick)
_DEFAULTS = {"repeats": (5, 2), "budget": (20.0, 1.0), "text_layers": (2, 2), "dtype": ("float32", "float32")}

_QUICK_NOTE = ("bench --quick: tiny models and inputs, a smoke test of the whole pipeline; its timings are not a "
               "measurement (patched/stock ratios of forwards this short are noise)")


def _given(args: argparse.Namespace, name: str):
    value = getattr(args, name)
    return _DEFAULTS[name][1 if args.quick else 0] if value is None else value


def _config(args: argparse.Namespace, device: str, dtypes: dict):
    from . import MODELS, QUICK_MODELS, SCENARIOS, BenchConfig

    models = tuple(args.models or (QUICK_MODELS if args.quick else MODELS))
    # By default the audio scenarios run only where every model is an Omni thinker (nothing else takes audio).
    omni = all(_is_omni_model(m) for m in models)
    chosen = args.scenarios or [n for n, s in SCENARIOS.items() if omni or not s.audio]
    common = dict(scenarios=tuple(chosen), scopes=tuple(args.scopes), device=device,
                  compile=(False, True) if args.compile else (False,), repeats=_given(args, "repeats"),
                  compile_mode=args.compile_mode,
                  budget_s=_given(args, "budget"), text_layers=_given(args, "text_layers"),
                  dtype=dtypes[_given(args, "dtype")], graph_breaks=not args.no_graph_breaks,
                  deadline_s=args.deadline, keep_going=args.keep_going, vision_attention=args.vision_attention)
    if args.quick:
        return BenchConfig(models=models, attns=tuple(args.attn or ("sdpa",)),
                           scale=0.08, max_frames=4, **common)
    attns = tuple(args.attn or (("sdpa", "eager") if device == "cuda" else ("sdpa",)))
    return BenchConfig(models=models, attns=attns, **common)


def _is_omni_model(model: str) -> bool:
    from ..inputs import is_omni
    from ..presets import PRESETS

    return model in PRESETS and is_omni(PRESETS[model].values["model_type"])


def _check(cfg, out: str) -> None:
    """Everything that can be wrong with the request, before the first model is built."""
    from ..compare.checks import check_attn, check_emulation, check_out_dir, check_vision_attention
    from ..inputs import is_omni
    from ..presets import load_config
    from . import SCENARIOS

    for attn in cfg.attns:
        check_attn(attn, device=cfg.device, dtype=cfg.dtype)
    check_vision_attention(cfg.vision_attention, device=cfg.device, dtype=cfg.dtype)
    if cfg.compile_mode is not None and True not in cfg.compile:
        raise ValueError(f"--compile-mode {cfg.compile_mode} applies to compiled cells: add --compile")
    unknown = [s for s in cfg.scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    for model in cfg.models:
        config = load_config(model)  # an unknown name, a missing folder or an unsupported model type, said now
        audio = [s for s in cfg.scenarios if SCENARIOS[s].audio]
        if audio and not is_omni(config):
            raise ValueError(f"scenario(s) {audio} feed audio, which only an Omni thinker takes; {model} is not one "
                             "(e.g. --models qwen3-omni-tiny qwen2.5-omni-tiny)")
    check_out_dir(out)
    if cfg.device == "cpu":
        check_emulation()  # the CPU run audits its syncs on the emulated device


def run_bench(args: argparse.Namespace, dtypes: dict) -> int:
    from ..audit import CudaUnavailable, real_cuda_available
    from ..display import step_progress
    from . import footnotes, pairs, run_matrix, table, write_results
    from .runner import step_count

    has_gpu = real_cuda_available()  # (torch.cuda.is_available() also answers True inside emulate_cuda())
    device = args.device or ("cuda" if has_gpu else "cpu")
    if device == "cuda" and not has_gpu:
        raise CudaUnavailable("--device cuda needs a CUDA GPU and this machine has none; use --device cpu")
    cfg = _config(args, device, dtypes)
    out = args.out or (quick_out() if args.quick else FULL_OUT)
    _check(cfg, out)
    name = args.name or f"bench-{device}{'-quick' if args.quick else ''}"

    if args.quick:
        print(_QUICK_NOTE)
    print(f"syncfree bench on {device}: {len(cfg.models)} models x {len(cfg.scenarios)} scenarios x "
          f"{len(cfg.scopes)} scopes x {len(cfg.attns)} attention x {len(cfg.compile)} compile, stock vs patched")
    print(f"results go to {os.path.join(out, name)}.json and .csv (rewritten after every scenario)", flush=True)
    config = dataclasses.asdict(cfg)

    def save(run, plot: bool = False) -> dict:
        # Rewritten after every scenario, so a run stopped by a timeout still leaves its results.
        return write_results(out, name, config, run.records, plot=plot, errors=run.errors, not_run=run.not_run,
                             skipped=run.skipped)

    # (a bar on a terminal; elsewhere one plain line per step as it starts)
    with step_progress(step_count(cfg)) as step:
        run = run_matrix(cfg, progress=step, on_update=save)
    paths = save(run, plot=not args.no_plot)
    rows = pairs(run.records)
    print("\n" + table(rows))
    for note in footnotes(rows, graph_breaks=cfg.graph_breaks):
        print(note)
    for e in run.errors:
        print(f"\nFAILED {e['model']} {e['attn']} {e['scenario'] or '(building the model)'}: {e['error']}")
    for c in run.skipped:
        print(f"\nskipped {c['model']} {c['attn']} {c['scenario']}: {c['why']}")
    if run.not_run:
        print(f"\nnot run (past the {cfg.deadline_s:g} s deadline): "
              + ", ".join(f"{c['model']}/{c['attn']}/{c['scenario']}" for c in run.not_run))
    print("\nwrote " + ", ".join(p for p in paths.values() if p))
    if not args.no_plot and rows and not paths.get("png"):
        print('no PNG plot written: matplotlib is not installed (pip install "syncfree[bench]", or pip install '
              "matplotlib)")
    return 1 if run.errors else 0
