"""The command line's checks of options, paths and numbers, made before any work starts.

A wrong value should cost the user a second, not a two-minute forward followed by a
traceback: each check raises a ``ValueError`` (or ``CudaUnavailable``) with a one-line
message that names the option, what is wrong, and what would do instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile

__all__ = ["ATTNS", "at_least_one", "positive_seconds", "positive_number", "check_attn", "check_vision_attention",
           "check_engine", "check_image_side", "check_json_path", "check_out_dir", "check_emulation", "image_unit"]

# What --attn takes. Transformers' own names beyond these (flash_attention_3, flex_attention, paged|...)
# are not what syncfree's patched attention was checked against, so they are refused rather than guessed at.
ATTNS = ("sdpa", "eager", "flash_attention_2", "varlen")


# ---- argparse types: a bad number is refused while parsing, in argparse's one line ----------------------
def at_least_one(text: str) -> int:
    """An int >= 1 (repeats, text layers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_number(text: str, unit: str = "") -> float:
    """A finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):  # (also refuses nan)
        raise argparse.ArgumentTypeError(f"must be a positive number{unit}, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """A finite float > 0, in seconds (budget, deadline)."""
    return positive_number(text, " of seconds")


# ---- attention and engine -----------------------------------------------------------------------------
def check_attn(attn: str, *, device: str, dtype: str) -> None:
    """Refuse an ``--attn`` value this run cannot honour.

    ``device``: where the forward runs, ``"cuda"`` (a real GPU), ``"cpu"`` (``bench --device cpu``)
    or ``"emulated"`` (``audit``/``demo`` without a GPU); ``dtype``: the model's, e.g. ``"bfloat16"``.
    """
    from .varlen import VARLEN, varlen_problem

    if attn not in ATTNS:
        raise ValueError(f"--attn {attn}: unknown attention implementation; choose one of {', '.join(ATTNS)}")
    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ValueError("--attn flash_attention_2 needs the flash-attn package, which is not installed; use sdpa, "
                         f"eager, or {VARLEN} (PyTorch's own flash kernel, on a CUDA GPU)")
    if attn == VARLEN:
        # PyTorch's flash kernel needs a CUDA GPU, PyTorch >= 2.10 (torch.nn.attention.varlen) and half precision.
        if device == "emulated":
            raise ValueError(f"--attn {VARLEN} runs PyTorch's flash kernel, which needs a CUDA GPU, and this machine "
                             "has none (the emulated device cannot run it); use --attn sdpa or eager")
        problem = varlen_problem(device, dtype)
        if problem:
            raise ValueError(problem)


def check_engine(engine: str) -> bool:
    """True when the run is to use the real GPU (``auto`` picks it when there is one)."""
    from ..audit import CudaUnavailable, real_cuda_available

    has_gpu = real_cuda_available()
    if engine == "cuda" and not has_gpu:
        raise CudaUnavailable("--engine cuda needs a CUDA GPU and this machine has none; use --engine emulated "
                              "(or auto)")
    if engine == "emulated" and has_gpu:
        raise ValueError("--engine emulated is for machines without a CUDA GPU, and this one has one; use "
                         "--engine cuda (or auto)")
    return engine == "cuda" or (engine == "auto" and has_gpu)


def check_emulation() -> None:
    """Build (or find in the cache) the emulator's shim now, so a missing compiler is said before a long build."""
    from ..audit import emulate_cuda

    with emulate_cuda():
        pass


# ---- sizes --------------------------------------------------------------------------------------------
def image_unit(config) -> int:
    """Image sides are multiples of patch size x merge size: 32 for Qwen3-VL, 28 for Qwen2/2.5-VL."""
    from ..plan.spec import vision_merge_size

    return config.vision_config.patch_size * vision_merge_size(config.vision_config)


def check_image_side(side: int | None, config) -> None:
    """Refuse an image side the processor would never produce (instead of rounding it silently)."""
    if side is None:
        return
    vc = config.vision_config
    unit = image_unit(config)
    if side <= 0 or side % unit:
        raise ValueError(f"--image-side {side}: must be a positive multiple of {unit} pixels for this model "
                         f"(patch size {vc.patch_size} x spatial merge size {unit // vc.patch_size}), e.g. "
                         f"{max(unit, round(side / unit) * unit)}")


# ---- output paths -------------------------------------------------------------------------------------
def _try_write(folder: str) -> None:
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".syncfree-write-check-"):
        pass


def check_json_path(path: str | None) -> None:
    """``--json PATH``: its folder exists and takes a new file (tried), and PATH is not a folder."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"--json {path}: that is a folder; give a file path such as {os.path.join(path, 'report.json')}")
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise ValueError(f"--json {path}: the folder {folder} {what}")
    try:
        _try_write(folder)
    except OSError as err:
        raise ValueError(f"--json {path}: cannot write in {folder} ({err.strerror or err})") from None


def check_out_dir(path: str) -> None:
    """``--out DIR``: the folder exists or can be made, and takes a new file (tried)."""
    try:
        os.makedirs(path, exist_ok=True)
        _try_write(path)
    except OSError as err:
        raise ValueError(f"--out {path}: cannot create or write files in that folder "
                         f"({err.strerror or err})") from None


def check_vision_attention(backend: str, device: str, dtype) -> None:
    """``--vision-attention``: a backend that can run where the command runs."""
    from ..rewrite.attention import check_backend

    check_backend(backend)
    name = str(dtype).replace("torch.", "")
    if backend == "varlen" and (device != "cuda" or name not in ("bfloat16", "float16")):
        raise ValueError("--vision-attention varlen runs PyTorch's flash kernel, which needs a CUDA GPU and "
                         f"--dtype bfloat16 or float16 (got {device}, {name}); use grouped or auto")
