"""The ``syncfree`` command: ``demo``, ``audit``, ``bench``, ``census``, ``patch``, ``doctor`` and ``presets``.

Its options are declared without torch or Transformers (``options``), so ``--help`` is instant; each command imports
its work when it runs.

Every option is checked before the work starts (``syncfree.compare.checks``), and every failure is one
line on stderr with a nonzero exit status (``syncfree.cli.errors``).
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import debug_from_env, one_line, run_command
from .options import add_audit_args, add_bench_args, add_census_args, add_doctor_args, add_patch_args, add_presets_args

__all__ = ["main"]

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}

_DESCRIPTION = """\
Vision-language models in Hugging Face Transformers (the Qwen-VL family and the
families that share its vision code) without host-device syncs, and the auditor
that proves it: on a GPU, or on a CPU-only machine through an emulated CUDA
device."""

_EPILOG = """\
examples:
  syncfree demo               # stock vs patched, Qwen3-VL-2B shapes (90 s)
  syncfree audit --compare --model qwen3-vl-8b --scope vision --inputs image
  syncfree bench --quick      # a smoke run of the benchmark on tiny models
  syncfree census             # every family with the vision split: syncs
  syncfree doctor             # after upgrading Transformers: do patches match?
  syncfree presets            # the models --model takes (random weights)

Errors are one line; add --debug (or set SYNCFREE_DEBUG=1) to see the traceback."""


_COMMANDS = ("demo", "audit", "bench", "census", "patch", "doctor", "presets")

# Each subcommand's --help ends with examples (the command line, what it does).
_EXAMPLES = {
    "demo": [("syncfree demo", "stock vs patched Qwen3-VL-2B shapes, audited (90 s)"),
             ("syncfree demo --inputs video", "the same with a video")],
    "audit": [("syncfree audit --compare --model qwen3-vl-tiny", "stock, patched, prepared side by side"),
              ("syncfree audit --train --model qwen3-vl-tiny", "one training step, by phase"),
              ("syncfree audit --model qwen3-vl-8b --scope vision --inputs image", "the stock tower alone")],
    "bench": [("syncfree bench --quick", "a smoke run on tiny models"),
              ("syncfree bench --device cpu --models qwen3-vl-2b --budget 8", "real shapes on the CPU")],
    "census": [("syncfree census", "every family with the vision split"),
               ("syncfree census --families qwen3_vl glm4v", "two families")],
    "patch": [("syncfree patch --report --model qwen2.5-vl-tiny", "what the patch rewrites, what it leaves"),
              ("syncfree patch --report --model kimi_k25", "a tiny model of a model type")],
    "doctor": [("syncfree doctor", "every family: does the patch match this release?"),
               ("syncfree doctor --families qwen3_vl", "one family")],
    "presets": [("syncfree presets", "every preset --model takes, with its model type"),
                ("syncfree presets --tiny", "the tiny ones (one per family)")],
}


def _examples(command: str) -> str:
    width = max(len(line) for line, _ in _EXAMPLES[command])
    return "examples:\n" + "\n".join(f"  {line.ljust(width)}  # {what}" for line, what in _EXAMPLES[command])




class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line too, pointing at the help of the command it is about."""

    def error(self, message: str):
        prog = self.prog
        if prog == "syncfree":  # options a subcommand did not know end up here: point at that command's help
            given = next((a for a in self._argv if a in _COMMANDS), None)
            if given is not None and message.startswith("unrecognized arguments"):
                prog = f"syncfree {given}"
        if message.startswith("argument COMMAND: invalid choice"):
            import difflib

            typed = message.split("'")[1] if "'" in message else ""
            close = difflib.get_close_matches(typed, _COMMANDS, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        self.exit(2, f"{prog}: error: {one_line(Exception(message))} (see {prog} --help)\n")

    _argv: list[str] = []  # the command line being parsed (set by main)


class _Version(argparse.Action):
    """``--version``, which imports torch (its version string names the build) only when asked."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    import torch  # its own version string names the build (+cu130, +cpu); the package metadata does not

    return f"syncfree {of('syncfree')} (torch {torch.__version__}, transformers {of('transformers')})"


def _add_debug(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--debug", action="store_true", default=default,
                   help="show the traceback of an error instead of one line (also: SYNCFREE_DEBUG=1)")


_LABELS = {
    "stock": "stock Transformers, inputs moved with .to('cuda')",
    "patched": "syncfree.patch, same inputs (one explicit read)",
    "patched+prepare": "syncfree.patch, inputs from syncfree.prepare",
}


def _render(rows: list[tuple]) -> str:
    """A plain table under the header ``rows[0]``: the first column left-aligned, the rest right-aligned."""
    from ..display import text_table

    return text_table(rows[0], rows[1:])


def _launches(summary: dict) -> str:
    return "-" if summary["launches"] is None else str(summary["launches"])


def _comparison(reports: dict) -> str:
    rows = [("", "syncs", "blocking copies", "h2d", "d2h", "source lines", "launches")]
    for variant, report in reports.items():
        t = report.summary()
        rows.append((_LABELS[variant], str(t["syncs"]), str(t["blocking_copies"]), str(t["h2d"]), str(t["d2h"]),
                     str(t["lines"]), _launches(t)))
    return _render(rows)


def _phase_comparison(reports: dict) -> str:
    from ..audit.phases import PHASES

    rows = [("syncs by phase", *PHASES, "total", "blocking copies", "launches")]
    for variant, report in reports.items():
        phases, t = report.by_phase(), report.summary()
        rows.append((_LABELS[variant], *(str(phases[p]["syncs"]) for p in PHASES), str(t["syncs"]),
                     str(t["blocking_copies"]), _launches(t)))
    return _render(rows)


def _run(args: argparse.Namespace, title: str, compare: bool) -> int:
    import torch

    from ..compare.checks import (
        check_attn,
        check_emulation,
        check_engine,
        check_image_side,
        check_json_path,
        check_vision_attention,
    )
    from ..compare.forward import VARIANTS, AuditSpec, check_input_kind, run_compare
    from ..compare.progress import ProgressLine
    from ..presets import load_config

    # Everything that can be wrong with the request is said now, not after minutes of work.
    use_gpu = check_engine(args.engine)
    check_attn(args.attn, device="cuda" if use_gpu else "emulated", dtype=_DTYPES[args.dtype])
    check_vision_attention(args.vision_attention, device="cuda" if use_gpu else "emulated", dtype=_DTYPES[args.dtype])
    check_json_path(args.json)
    config = load_config(args.model)  # (also: unknown model, folder, model type)
    check_image_side(args.image_side, config)
    if not use_gpu:
        check_emulation()

    train = getattr(args, "train", False)
    for option in ("grad_ckpt", "optimizer"):
        if getattr(args, option, None) and not train:
            raise ValueError(f"--{option.replace('_', '-')} applies to a training step: add --train")
    if train and args.scope != "full":
        raise ValueError(f"--train runs a whole training step: --scope {args.scope} cannot be combined with it")
    compare = compare or train  # a training step is always audited stock vs patched
    spec = AuditSpec(model=args.model, inputs=args.inputs, attn=args.attn, scope=args.scope,
                     text_layers=args.text_layers, dtype=getattr(torch, _DTYPES[args.dtype]),
                     image_side=args.image_side, vision_attention=args.vision_attention)
    check_input_kind(spec, config)  # (before the header: a refused request prints only its error)
    what = (f"training step ({args.optimizer or 'adamw'}; gradient checkpointing: {args.grad_ckpt or 'off'})"
            if train else f"scope={spec.scope}")
    print(f"{title}: {spec.model}, {spec.inputs} inputs, attn={spec.attn}, {what}", flush=True)
    line = ProgressLine(sys.stderr)  # which forward is running, on a terminal only
    try:
        if train:
            from ..compare.train import run_train_compare

            reports, about = run_train_compare(spec, grad_ckpt=args.grad_ckpt, engine="cuda" if use_gpu else "emulated",
                                               optimizer=args.optimizer or "adamw",
                                               progress=line.show if line.enabled else None)
        else:
            reports, about = run_compare(spec, engine="cuda" if use_gpu else "emulated",
                                         variants=VARIANTS if compare else ("stock",),
                                         progress=line.show if line.enabled else None)
    finally:
        line.clear()
    n = len(reports)
    if "refused" in about:  # (data, not an error: the stock audit stands, and the line says why there is no other)
        print(f"not patched: {about['refused']}")
    print(f"engine: {about['engine']}; vision depth {about['vision_depth']}, text layers {about['text_layers']}; "
          f"grids {about['grids']}; sequence {about['sequence']}")
    if train:
        print(f"{n} audited training steps in {about['steps_s']:.1f} s (model built and moved in "
              f"{about['build_s']:.1f} s); losses {about['losses']}\n")
        print(_phase_comparison(reports) + "\n")
    else:
        print(f"{n} audited forward{'s' if n > 1 else ''} in {about['forwards_s']:.1f} s "
              f"(model built and moved in {about['build_s']:.1f} s)\n")
    if compare and not train:
        print(_comparison(reports) + "\n")
    for variant, report in reports.items():
        if compare:
            print(f"-- {_LABELS[variant]} --")
        launches = report.summary()["launches"]
        print((report.table() if report.events else "(no syncs, no copies" +
               (f"; {launches} kernel launches)" if launches is not None else ")")) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": about, **{v: r.to_dict() for v, r in reports.items()}} if compare
                      else {"run": about, **reports["stock"].to_dict()}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


# Each command's parser: its name, its one-line help, its description and how its arguments are added.
_COMMAND_PARSERS = (
    ("demo", "stock vs patched Qwen3-VL, audited; offline, no GPU needed",
     "Audit three forwards of a Qwen3-VL-2B-shaped model with random weights (stock, patched, patched with prepare) "
     "and list every sync by source line.",
     lambda p: add_audit_args(p, model="qwen3-vl-2b", inputs="mixed", text_layers=2, dtypes=_DTYPES)),
    ("audit", "every host sync and copy of one forward, by source line",
     "List every host sync and host/device copy of one forward, by source line.",
     lambda p: add_audit_args(p, model="qwen3-vl-tiny", inputs="image", text_layers=None, dtypes=_DTYPES)),
    ("bench", "stock vs patched latency, syncs, graph breaks per scenario",
     "Stock vs patched, side by side in one run: latency, host syncs, graph breaks (and on a GPU kernel time, busy "
     "fraction, memcpys, peak memory).",
     lambda p: add_bench_args(p, _DTYPES)),
    ("census", "every family with the vision split: stock vs patched",
     "Find every model family of the installed Transformers whose vision attention splits by lengths.tolist(), build "
     "a tiny one, and audit a forward stock and patched on the emulated device.",
     add_census_args),
    ("patch", "what syncfree.patch rewrites in a model, and the syncs it leaves",
     "Say what syncfree.patch rewrites in one model (any family with the packed vision split: a preset, a checkpoint "
     "folder or a model type) and audit a forward on the emulated device: every sync left, by source line.",
     lambda p: add_patch_args(p, _DTYPES)),
    ("doctor", "after upgrading Transformers: which families' patches still match",
     "For the installed torch and Transformers, one line per family: fully supported and matching, changed (the "
     "function, and the installed code nearest to what the patch expects), generic fix only, or not in this release. "
     "Exit status 1 where a fully supported family no longer matches.",
     add_doctor_args),
    ("presets", "the presets --model takes: published shapes and tiny test models",
     "List the presets --model takes (random weights, nothing downloaded): each with its model type and whether it is "
     "a tiny test model or a published shape.",
     add_presets_args),
)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="syncfree", description=_DESCRIPTION, epilog=_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_debug(parser, default=False)
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print syncfree's version and the torch and Transformers it runs with")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for name, help, description, add_args in _COMMAND_PARSERS:
        command = sub.add_parser(name, help=help, description=description, epilog=_examples(name),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        add_args(command)
        # (default=SUPPRESS in the subcommands: `syncfree --debug audit` and `syncfree audit --debug` both work.)
        _add_debug(command, default=argparse.SUPPRESS)
    return parser


def _list_presets(args: argparse.Namespace) -> int:
    from ..display import text_table
    from ..presets import PRESETS

    rows = [(name, p.values["model_type"], "tiny" if name.endswith("-tiny") else "published shape")
            for name, p in PRESETS.items() if not args.tiny or name.endswith("-tiny")]
    print(text_table(("preset", "model type", "kind"), rows))
    return 0


def _user_paths(args: argparse.Namespace) -> list[str]:
    """The paths the user gave: an OS error about one of them is the user's to fix (exit 2), not a bug."""
    paths = [getattr(args, "model", None), getattr(args, "json", None), getattr(args, "out", None)]
    paths += list(getattr(args, "models", None) or [])
    return [p for p in paths if p]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    parser._argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser.parse_args(argv)
    debug = args.debug or debug_from_env()
    if args.command == "bench":
        from ..bench.command import run_bench

        def work() -> int:
            return run_bench(args, _DTYPES)
    elif args.command == "census":
        from ..census.command import run_census_command

        def work() -> int:
            return run_census_command(args)
    elif args.command == "doctor":
        from ..census.doctor import run_doctor_command

        def work() -> int:
            return run_doctor_command(args)
    elif args.command == "presets":
        def work() -> int:
            return _list_presets(args)
    elif args.command == "patch":
        from ..census.patch_report import run_patch_command

        def work() -> int:
            return run_patch_command(args, _DTYPES)
    else:
        def work() -> int:
            compare = args.command == "demo" or args.compare
            return _run(args, f"syncfree {args.command}", compare=compare)
    return run_command(args.command, work, debug=debug, user_paths=_user_paths(args))


if __name__ == "__main__":
    sys.exit(main())
