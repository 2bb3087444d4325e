"""Builds and loads the tiny C++ shim that gives "cuda" a fake device guard and answers ATen's CUDA hooks.

Why a shim at all: see fake_cuda_guard.cpp. It is built once per PyTorch
version and compiler flag set with the system C++ compiler against the headers
that ship inside the torch wheel, and cached under ``$SYNCFREE_CACHE`` (default
``~/.cache/syncfree``). Nothing here touches CUDA.

The C++ standard is the one PyTorch's own extension builder
(``torch.utils.cpp_extension``) compiles extensions with: PyTorch 2.14's headers
need C++20, older ones build with C++17, and a fixed choice breaks one or the other.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

__all__ = ["EmulationUnavailable", "FakeCudaGuard", "cxx_standard", "build_flags"]

_SOURCE = Path(__file__).with_name("fake_cuda_guard.cpp")


class EmulationUnavailable(RuntimeError):
    """Something the emulated accelerator needs is missing on this machine.

    ``command`` holds the compiler command when building the shim failed, ``output`` its full output.
    """

    command: list[str] | None = None
    output: str = ""


def _cache_dir() -> Path:
    root = os.environ.get("SYNCFREE_CACHE") or os.path.join(Path.home(), ".cache", "syncfree")
    return Path(root)


def _find_compiler() -> str:
    chosen = os.environ.get("CXX")
    if chosen:  # the user's explicit choice: use it or say why not, never silently another compiler
        found = shutil.which(chosen)
        if found is None:
            raise EmulationUnavailable(f"syncfree.emulate_cuda() needs a C++ compiler to build its shim, and $CXX is "
                                       f"set to {chosen!r}, which is not an executable; fix or unset $CXX")
        return found
    for candidate in ("c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise EmulationUnavailable(
        "syncfree.emulate_cuda() needs a C++ compiler to build a 30-line shim that gives 'cuda' a fake "
        "device guard on this CPU-only PyTorch, and none was found (looked for $CXX, c++, g++, clang++). "
        "Install one (Debian/Ubuntu: `apt-get install g++`; Fedora: `dnf install gcc-c++`; macOS: "
        "`xcode-select --install`) or point $CXX at one."
    )


def _torch_dirs() -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    include, lib = root / "include", root / "lib"
    if not (include / "c10" / "core" / "impl" / "FakeGuardImpl.h").exists():
        raise EmulationUnavailable(
            f"syncfree.emulate_cuda() needs PyTorch's C++ headers, but {include} has no "
            "c10/core/impl/FakeGuardImpl.h. Install a regular torch wheel from PyPI (it ships the headers)."
        )
    return include, lib


@functools.lru_cache(maxsize=None)
def cxx_standard() -> str:
    """The ``-std=`` value PyTorch's extension builder uses for this PyTorch (e.g. ``c++20`` for 2.14).

    Read from ``torch.utils.cpp_extension`` itself (the newest standard its unix build flags name), so a
    PyTorch that moves to a newer standard is followed without a syncfree release. C++17 if none is found.
    """
    # Read as text: importing the module logs about CUDA_HOME on CPU-only builds.
    try:
        source = (Path(torch.__file__).parent / "utils" / "cpp_extension.py").read_text()
    except OSError:  # a stripped install: fall back to the standard PyTorch used for years
        return "c++17"
    years = [int(y) for y in re.findall(r"-std=c\+\+(\d\d)\b", source)]
    # Two-digit years: 17 < 20 < 23, and none of them wrapped around yet.
    return f"c++{max(years)}" if years else "c++17"


def build_flags() -> list[str]:
    """Compiler flags besides input, output and paths: what the cache key and the error name."""
    return ["-O1", "-shared", "-fPIC", f"-std={cxx_standard()}",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"]


def _first_error(stderr: str) -> str:
    """The compiler's first error line (the tail of its output is usually notes cut mid-way)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"\berror\b", line, re.IGNORECASE):
            return line
    return lines[0] if lines else "(the compiler printed nothing)"


def _build(target: Path) -> None:
    compiler = _find_compiler()
    include, lib = _torch_dirs()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build to a temporary name and rename: two processes may build at once.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, *build_flags(), f"-I{include}", str(_SOURCE), f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}",
           "-o", tmp]
    if sys.platform == "darwin":
        cmd[1:1] = ["-undefined", "dynamic_lookup"]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as err:
        os.unlink(tmp)
        raise EmulationUnavailable(f"syncfree.emulate_cuda() could not run the C++ compiler {compiler}: {err}") from err
    if result.returncode != 0:
        os.unlink(tmp)
        error = EmulationUnavailable(
            f"syncfree.emulate_cuda() could not build its fake CUDA guard shim with {compiler} "
            f"(-std={cxx_standard()}, torch {torch.__version__}): {_first_error(result.stderr)} -- "
            "make sure the compiler supports that C++ standard (GCC >= 10 or Clang >= 10 for C++20), or point "
            "$CXX at one that does (SYNCFREE_DEBUG=1 shows the command and all of its output)."
        )
        error.command, error.output = cmd, result.stderr
        raise error
    os.replace(tmp, target)


def _library_path() -> Path:
    key = _SOURCE.read_bytes() + torch.__version__.encode() + " ".join(build_flags()).encode()
    digest = hashlib.sha256(key).hexdigest()[:16]
    return _cache_dir() / f"fake_cuda_guard-{digest}.so"


class FakeCudaGuard:
    """Installs the fake guard, and the emulated answers of ATen's CUDA hooks (which the autograd engine
    asks before a backward), on ``install()``; restores what was there on ``restore()``."""

    _lib: ctypes.CDLL | None = None

    @classmethod
    def _load(cls) -> ctypes.CDLL:
        if cls._lib is None:
            path = _library_path()
            if not path.exists():
                _build(path)
            lib = ctypes.CDLL(str(path))
            lib.syncfree_install_fake_cuda_guard.restype = ctypes.c_void_p
            lib.syncfree_restore_cuda_guard.argtypes = [ctypes.c_void_p]
            lib.syncfree_install_emulated_cuda_hooks.restype = ctypes.c_void_p
            lib.syncfree_restore_cuda_hooks.argtypes = [ctypes.c_void_p]
            cls._lib = lib
        return cls._lib

    def __init__(self) -> None:
        self._previous: int | None = None
        self._hooks: int | None = None

    def install(self) -> None:
        lib = self._load()
        self._previous = lib.syncfree_install_fake_cuda_guard()
        self._hooks = lib.syncfree_install_emulated_cuda_hooks()

    def restore(self) -> None:
        lib = self._load()
        lib.syncfree_restore_cuda_hooks(self._hooks)
        lib.syncfree_restore_cuda_guard(self._previous)
        self._previous = self._hooks = None
