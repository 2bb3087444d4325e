"""Builds and loads the tiny C++ shim that gives "cuda" a fake device guard.

Why a shim at all: see fake_cuda_guard.cpp. It is built once per PyTorch
version with the system C++ compiler against the headers that ship inside the
torch wheel, and cached under ``$SYNCFREE_CACHE`` (default
``~/.cache/syncfree``). Nothing here touches CUDA.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

__all__ = ["EmulationUnavailable", "FakeCudaGuard"]

_SOURCE = Path(__file__).with_name("fake_cuda_guard.cpp")


class EmulationUnavailable(RuntimeError):
    """Something the emulated accelerator needs is missing on this machine."""


def _cache_dir() -> Path:
    root = os.environ.get("SYNCFREE_CACHE") or os.path.join(Path.home(), ".cache", "syncfree")
    return Path(root)


def _find_compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
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


def _build(target: Path) -> None:
    compiler = _find_compiler()
    include, lib = _torch_dirs()
    abi = int(torch.compiled_with_cxx11_abi())
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build to a temporary name and rename: two processes may build at once.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [
        compiler, "-O1", "-shared", "-fPIC", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}", str(_SOURCE), f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}", "-o", tmp,
    ]
    if sys.platform == "darwin":
        cmd.insert(1, "-undefined")
        cmd.insert(2, "dynamic_lookup")
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise EmulationUnavailable(
            "syncfree.emulate_cuda() could not build its fake CUDA guard shim.\n"
            f"command: {' '.join(cmd)}\n{result.stderr.strip()[-2000:]}"
        )
    os.replace(tmp, target)


def _library_path() -> Path:
    digest = hashlib.sha256(_SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    return _cache_dir() / f"fake_cuda_guard-{digest}.so"


class FakeCudaGuard:
    """Installs the fake guard on ``install()`` and restores the previous one on ``restore()``."""

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
            cls._lib = lib
        return cls._lib

    def __init__(self) -> None:
        self._previous: int | None = None

    def install(self) -> None:
        self._previous = self._load().syncfree_install_fake_cuda_guard()

    def restore(self) -> None:
        self._load().syncfree_restore_cuda_guard(self._previous)
        self._previous = None
