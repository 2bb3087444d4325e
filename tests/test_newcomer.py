"""What a new user trips on first: wrong arguments get one clear line naming the problem, the command line
says its version and points at the help of the command a typo is about, and --debug keeps the exit status."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import syncfree
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import build_model, load_config


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "syncfree.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_version_names_syncfree_torch_and_transformers():
    from importlib.metadata import version

    run = _cli("--version")
    assert run.returncode == 0
    assert run.stdout.startswith("syncfree ") and f"torch {torch.__version__}" in run.stdout
    assert f"transformers {version('transformers')}" in run.stdout


def test_an_unknown_option_of_a_command_points_at_that_command_s_help():
    run = _cli("audit", "--modle", "qwen3-vl-tiny")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "syncfree audit: error: unrecognized arguments: --modle qwen3-vl-tiny (see syncfree audit --help)"]


def test_a_mistyped_command_is_one_line_with_the_closest_command():
    run = _cli("aduit")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "did you mean 'audit'?" in run.stderr


@pytest.mark.parametrize("how", [("--debug",), ()], ids=["--debug", "SYNCFREE_DEBUG"])
def test_debug_shows_the_traceback_and_keeps_the_user_error_status(how):
    run = _cli("audit", "--model", "no-such-preset", *how, env={} if how else {"SYNCFREE_DEBUG": "1"})
    assert run.returncode == 2
    assert "Traceback (most recent call last)" in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("syncfree audit: error: unknown model 'no-such-preset'")


def test_text_layers_never_lengthens_a_model():
    layers = load_config("qwen3-vl-tiny").text_config.num_hidden_layers
    assert load_config("qwen3-vl-tiny", text_layers=layers).text_config.num_hidden_layers == layers
    with pytest.raises(ValueError, match=f"text_layers={layers + 1} is more than the {layers} text layers"):
        load_config("qwen3-vl-tiny", text_layers=layers + 1)
    run = _cli("audit", "--text-layers", str(layers + 97))
    assert run.returncode == 2 and "can only shorten the text model" in run.stderr


@pytest.mark.parametrize("call,what", [
    (lambda: syncfree.patch("a string"), "syncfree.patch takes a model"),
    (lambda: syncfree.unpatch(3), "syncfree.unpatch takes a model"),
    (lambda: syncfree.is_patched(None), "syncfree.is_patched takes a model"),
    (lambda: syncfree.prepare([1, 2], "cpu"), "syncfree.prepare takes the processor's output"),
])
def test_a_wrong_argument_is_a_type_error_that_names_it(call, what):
    with pytest.raises(TypeError, match=what):
        call()


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3-vl-tiny")


def test_prepare_for_cuda_without_a_gpu_says_how_to_emulate(model):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    batch = build_inputs(model.config, named_layout("image", side=64))
    with pytest.raises(RuntimeError, match=r"no CUDA device; run it inside syncfree\.emulate_cuda\(\)"):
        syncfree.prepare(batch, "cuda", model)
    with syncfree.emulate_cuda():
        assert syncfree.prepare(batch, "cuda", model)["input_ids"].device.type == "cuda"


def test_a_token_mismatch_advises_passing_the_model_only_when_it_was_not_passed(model):
    batch = build_inputs(model.config, named_layout("image", side=64))
    types = batch["mm_token_type_ids"].clone()
    types[0, 0] = 1  # a text token marked as an image placeholder
    batch = {**batch, "mm_token_type_ids": types}
    with pytest.raises(ValueError) as given:
        syncfree.prepare(batch, "cpu", model)
    assert "pass the model" not in str(given.value) and "the model's image_token_id" in str(given.value)
    with pytest.raises(ValueError, match="pass the model or its config"):
        syncfree.prepare(batch, "cpu")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_gpu_scripts_refuse_a_machine_without_a_gpu_in_one_line():
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    run = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu", "run.sh"), os.devnull + "-not-a-dir"],
                         capture_output=True, text=True, timeout=120, env={**env, "PYTHON": sys.executable})
    assert run.returncode == 2 and "no CUDA device here" in run.stderr and "Traceback" not in run.stderr + run.stdout
    cross = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu", "cross_check.py"), "--out",
                            os.devnull],
                           capture_output=True, text=True, timeout=120)
    assert cross.returncode == 2 and "needs a CUDA device" in cross.stderr and "FAILED" not in cross.stdout


def test_python_dash_m_syncfree_is_the_command():
    """Where the venv's scripts are not on PATH, ``python -m syncfree`` is the command (it said 'No module named
    syncfree.__main__')."""
    run = subprocess.run([sys.executable, "-m", "syncfree", "--version"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout == _cli("--version").stdout


def test_the_verbs_named_like_their_modules_stay_functions_and_can_be_replaced(monkeypatch):
    """``syncfree.audit``, ``prepare`` and ``compile_vision`` load on first use and stay the functions after their
    modules are imported; a user's replacement (``monkeypatch``, ``mock.patch``) holds, and undoing it restores them."""
    import importlib

    import syncfree

    importlib.import_module("syncfree.audit.emulate")
    importlib.import_module("syncfree.prepare")
    assert callable(syncfree.audit) and callable(syncfree.prepare) and callable(syncfree.compile_vision)
    original = syncfree.prepare
    monkeypatch.setattr(syncfree, "prepare", lambda *a, **k: "replaced")
    assert syncfree.prepare() == "replaced"
    monkeypatch.undo()
    assert syncfree.prepare is original
