"""Every error of the ``syncfree`` command is one line on stderr and a nonzero exit status.

The error paths run the real console script (the ``syncfree`` executable that ``pip install``
puts next to the interpreter) in a subprocess, as a user meets them. Each is refused before
any model is built, so each run costs about the import of torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

from syncfree.cli import main

SCRIPT = os.path.join(os.path.dirname(sys.executable), "syncfree")
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a CUDA GPU")
FAST = ["--model", "qwen3-vl-tiny", "--scope", "vision"]


def _syncfree(*args: str, env: dict | None = None, cwd=None):
    environ = {k: v for k, v in os.environ.items() if k != "SYNCFREE_DEBUG"}
    environ.update(env or {})
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=environ, cwd=cwd, timeout=300)


def _refused(result, status: int = 2) -> str:
    """The one stderr line of a refused command (and nothing else went wrong)."""
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_the_console_script_is_installed():
    assert os.access(SCRIPT, os.X_OK), f"{SCRIPT}: run `pip install -e .` first"


# ---- the emulator cannot be built ---------------------------------------------------------------------
def _no_shim_env(tmp_path, **extra) -> dict:
    """No cached shim (an empty cache), and a PATH without a compiler."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "bin").mkdir()
    return {"SYNCFREE_CACHE": str(tmp_path / "cache"), "PATH": str(tmp_path / "bin"), **extra}


def test_no_compiler_for_the_emulator_is_one_line(tmp_path):
    result = _syncfree("audit", *FAST, env=_no_shim_env(tmp_path))
    line = _refused(result)
    assert line.startswith("syncfree audit: error: syncfree.emulate_cuda() needs a C++ compiler")
    assert "apt-get install g++" in line
    assert result.stdout == ""  # refused before the header: nothing was built


def test_an_unusable_cxx_is_named_not_replaced_by_another_compiler(tmp_path):
    env = _no_shim_env(tmp_path, CXX="/nonexistent-compiler")
    env["PATH"] = os.environ["PATH"]  # a working c++ is on the PATH, but the user chose $CXX
    line = _refused(_syncfree("audit", *FAST, env=env))
    assert "$CXX is set to '/nonexistent-compiler', which is not an executable" in line


def _failing_compiler(tmp_path) -> str:
    path = tmp_path / "bin" / "fake-c++"
    path.write_text('#!/bin/sh\necho "fake_cuda_guard.cpp:1:1: error: this compiler is fake" >&2\n'
                    'echo "a note after the error" >&2\nexit 1\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.slow
def test_a_compiler_that_fails_is_one_line_and_debug_shows_its_command_and_output(tmp_path):
    env = _no_shim_env(tmp_path)
    env["CXX"] = _failing_compiler(tmp_path)
    line = _refused(_syncfree("demo", *FAST, env=env))
    assert "could not build its fake CUDA guard shim" in line and "error: this compiler is fake" in line

    for debug in (["--debug", "demo", *FAST], ["demo", *FAST, "--debug"]):
        shown = _syncfree(*debug, env=env)
        # --debug adds the traceback and keeps the status: 2, the user's to fix (a missing compiler)
        assert shown.returncode == 2 and "Traceback" in shown.stderr
        assert f"the failing command: {env['CXX']} " in shown.stderr
        assert "a note after the error" in shown.stderr  # the compiler's whole output, not only its first error
    by_env = _syncfree("demo", *FAST, env={**env, "SYNCFREE_DEBUG": "1"})
    assert by_env.returncode == 2 and "Traceback" in by_env.stderr and "the failing command:" in by_env.stderr


# ---- models -------------------------------------------------------------------------------------------
def test_a_checkpoint_of_an_unsupported_model_type_names_the_type_and_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    for args in (["audit", "--model", str(tmp_path), "--scope", "vision"],
                 ["bench", "--quick", "--models", str(tmp_path), "--out", str(tmp_path / "out")]):
        line = _refused(_syncfree(*args))
        assert "model type 'bert'" in line and "does not support" in line
        from syncfree.patching import FAMILIES

        assert ", ".join(FAMILIES) in line


def test_a_model_path_that_does_not_exist_says_so(tmp_path):
    missing = str(tmp_path / "no-such-checkpoint")
    line = _refused(_syncfree("audit", "--model", missing, "--scope", "vision"))
    assert f"model folder {missing!r} does not exist" in line and "`syncfree presets` lists them" in line


def test_a_folder_without_config_json_says_so(tmp_path):
    line = _refused(_syncfree("audit", "--model", str(tmp_path), "--scope", "vision"))
    assert f"model folder {str(tmp_path)!r} holds no config.json" in line


# ---- engine and attention -----------------------------------------------------------------------------
@NO_GPU
def test_engine_cuda_without_a_gpu_is_refused_up_front():
    line = _refused(_syncfree("audit", *FAST, "--engine", "cuda"))
    assert line == ("syncfree audit: error: --engine cuda needs a CUDA GPU and this machine has none; use "
                    "--engine emulated (or auto)")


@NO_GPU
@pytest.mark.parametrize("command", ["audit", "demo"])
def test_varlen_attention_without_a_gpu_is_syncfree_own_refusal(command):
    line = _refused(_syncfree(command, *FAST, "--attn", "varlen"))
    assert "--attn varlen runs PyTorch's flash kernel, which needs a CUDA GPU" in line
    assert "attn_implementation" not in line  # not Transformers' error


@pytest.mark.parametrize("command", ["audit", "bench"])
def test_unknown_attention_is_refused_up_front(command, tmp_path):
    extra = ["--quick", "--out", str(tmp_path)] if command == "bench" else FAST
    line = _refused(_syncfree(command, *extra, "--attn", "flash"))
    assert line == (f"syncfree {command}: error: --attn flash: unknown attention implementation; choose one of "
                    "sdpa, eager, flash_attention_2, varlen")


def test_flash_attention_2_without_flash_attn_is_refused():
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    line = _refused(_syncfree("audit", *FAST, "--attn", "flash_attention_2"))
    assert "needs the flash-attn package, which is not installed" in line


# ---- output paths -------------------------------------------------------------------------------------
def test_json_in_a_folder_that_does_not_exist_is_refused_before_the_audit(tmp_path):
    path = tmp_path / "no" / "such" / "x.json"
    result = _syncfree("audit", *FAST, "--json", str(path))
    assert _refused(result) == f"syncfree audit: error: --json {path}: the folder {path.parent} does not exist"
    assert result.stdout == ""  # nothing ran


def test_json_path_that_is_a_folder_is_refused(tmp_path):
    assert "that is a folder" in _refused(_syncfree("audit", *FAST, "--json", str(tmp_path)))


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux's /proc")
def test_bench_out_that_cannot_be_written_is_refused_before_the_first_scenario(tmp_path):
    result = _syncfree("bench", "--quick", "--out", "/proc")
    assert _refused(result).startswith("syncfree bench: error: --out /proc: cannot create or write files")
    assert result.stdout == ""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "--out" in _refused(_syncfree("bench", "--quick", "--out", str(blocker / "results")))


# ---- numbers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model,side,unit", [("qwen3-vl-tiny", "7", 32), ("qwen3-vl-tiny", "-64", 32),
                                             ("qwen3-vl-tiny", "0", 32), ("qwen2.5-vl-tiny", "64", 28)])
def test_image_side_must_be_a_positive_multiple_of_the_model_unit(model, side, unit):
    line = _refused(_syncfree("audit", "--model", model, "--scope", "vision", "--image-side", side))
    assert f"--image-side {side}: must be a positive multiple of {unit} pixels" in line


@pytest.mark.parametrize("args,words", [
    (["bench", "--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    (["bench", "--budget", "0"], "argument --budget: must be a positive number of seconds, got 0"),
    (["bench", "--deadline", "-5"], "argument --deadline: must be a positive number of seconds, got -5"),
    (["bench", "--text-layers", "0"], "argument --text-layers: must be at least 1, got 0"),
    (["audit", "--text-layers", "0"], "argument --text-layers: must be at least 1, got 0"),
    (["audit", "--scope", "everything"], "argument --scope: invalid choice"),
])
def test_bad_numbers_and_choices_are_one_line(args, words):
    line = _refused(_syncfree(*args))
    assert line.startswith(f"syncfree {args[0]}: error: {words}") and line.endswith(f"(see syncfree {args[0]} --help)")


# ---- in-process: the checks and the error policy ------------------------------------------------------
def test_range_types():
    from syncfree.compare.checks import at_least_one, positive_seconds

    assert at_least_one("3") == 3 and positive_seconds("0.5") == 0.5
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            at_least_one(bad)
    for bad in ("0", "-2", "nan", "inf", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_seconds(bad)


def test_image_side_check_uses_the_model_unit():
    from syncfree.compare.checks import check_image_side
    from syncfree.presets import load_config

    qwen3, qwen25 = load_config("qwen3-vl-tiny"), load_config("qwen2.5-vl-tiny")
    for side in (None, 32, 448):
        check_image_side(side, qwen3)
    for side in (None, 28, 56, 448):
        check_image_side(side, qwen25)
    for side, config in ((7, qwen3), (-64, qwen3), (0, qwen3), (56, qwen3), (64, qwen25)):
        with pytest.raises(ValueError, match="positive multiple of"):
            check_image_side(side, config)


def test_output_path_checks_try_a_write(tmp_path):
    from syncfree.compare.checks import check_json_path, check_out_dir

    check_json_path(str(tmp_path / "r.json"))
    check_out_dir(str(tmp_path / "new" / "results"))
    assert (tmp_path / "new" / "results").is_dir() and not list((tmp_path / "new" / "results").iterdir())
    with pytest.raises(ValueError, match="does not exist"):
        check_json_path(str(tmp_path / "missing" / "r.json"))
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="cannot write in"):
            check_json_path(str(locked / "r.json"))


def _raising(exc: BaseException):
    def run_compare(*args, **kwargs):
        raise exc

    return run_compare


@pytest.mark.parametrize("exc,status", [
    (RuntimeError("boom\nsecond line"), 1),
    (KeyError("x"), 1),
    (ValueError("bad\nvalue"), 2),
    (FileNotFoundError(2, "No such file or directory", "/elsewhere/weights.safetensors"), 1),
])
def test_errors_become_one_line_user_errors_exit_2_and_internal_ones_exit_1(monkeypatch, capsys, exc, status):
    import syncfree.compare.forward

    monkeypatch.delenv("SYNCFREE_DEBUG", raising=False)
    monkeypatch.setattr(syncfree.compare.forward, "run_compare", _raising(exc))
    assert main(["audit", *FAST]) == status
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("syncfree audit: error: ")
    if status == 1:
        assert f"internal error: {type(exc).__name__}" in line and "rerun with --debug" in line
    else:
        assert line == "syncfree audit: error: bad value"


def test_an_os_error_about_the_users_own_path_is_theirs(monkeypatch, capsys, tmp_path):
    import syncfree.compare.forward

    monkeypatch.delenv("SYNCFREE_DEBUG", raising=False)
    monkeypatch.setattr(syncfree.compare.forward, "run_compare",
                        _raising(PermissionError(13, "Permission denied", str(tmp_path / "r.json"))))
    assert main(["audit", *FAST, "--json", str(tmp_path / "r.json")]) == 2
    assert "Permission denied" in capsys.readouterr().err


def test_debug_re_raises(monkeypatch):
    import syncfree.compare.forward

    monkeypatch.setattr(syncfree.compare.forward, "run_compare", _raising(RuntimeError("boom")))
    monkeypatch.delenv("SYNCFREE_DEBUG", raising=False)
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "audit", *FAST])
    monkeypatch.setenv("SYNCFREE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["audit", *FAST])


def test_help_lists_every_command_on_one_line_each_with_examples(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("demo", "audit", "bench", "census"):
        assert any(line.split()[:1] == [command] and len(line.split()) > 3 for line in out.splitlines()), out
    assert "examples:" in out and "syncfree bench --quick" in out and "``" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_one_line_joins_lines():
    from syncfree.cli.errors import one_line

    assert one_line(ValueError("a\n  b\n\nc ")) == "a b c"
    assert one_line(KeyboardInterrupt()) == "KeyboardInterrupt"


@pytest.mark.parametrize("args,words", [
    (["audit", "--grad-ckpt", "reentrant"], "add --train"),
    (["audit", "--optimizer", "sgd"], "add --train"),
    (["audit", "--train", "--scope", "vision"], "--scope vision cannot be combined"),
])
def test_training_options_that_do_not_fit_together_are_refused(args, words):
    assert words in _refused(_syncfree(*args))


@pytest.mark.slow
def test_audit_train_prints_the_step_by_phase(tmp_path):
    out = tmp_path / "train.json"
    result = _syncfree("audit", "--train", "--model", "qwen3-vl-tiny", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "syncs by phase" in result.stdout and "recompute" in result.stdout
    import json

    data = json.loads(out.read_text())
    assert data["run"]["scope"] == "train"
    assert data["patched+prepare"]["summary"]["syncs"] == 0
    assert set(data["stock"]["phases"]) == {"forward", "recompute", "backward", "optimizer", "trainer"}


@pytest.mark.parametrize("command", ["demo", "audit", "bench", "census", "patch", "doctor"])
def test_every_command_is_suggested_and_its_help_ends_with_examples_that_parse(command, capsys):
    from syncfree.cli.main import _EXAMPLES, _parser

    typo = command[:-1] + ("x" if command[-1] != "x" else "y")
    with pytest.raises(SystemExit) as exit_:
        main([typo])
    assert exit_.value.code == 2 and f"did you mean {command!r}?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "\nexamples:\n" in capsys.readouterr().out
    for line, _ in _EXAMPLES[command]:
        args = _parser().parse_args(line.split()[1:])
        assert args.command == command


def test_audio_inputs_for_a_model_without_audio_print_only_the_error():
    """Refused before the work starts, and before the audit's header line: the user sees only why."""
    result = _syncfree("audit", "--inputs", "audio", *FAST)
    line = _refused(result)
    assert "--inputs audio needs an Omni thinker" in line
    assert result.stdout == ""
