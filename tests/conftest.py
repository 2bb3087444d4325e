"""Shared fixtures. Tests that need a real GPU carry the ``gpu`` marker and are skipped without one;
everything else runs on a CPU-only machine through the emulated device."""

from __future__ import annotations

import os

# One intra-op thread per xdist worker: with a worker per core, torch's own thread pool in each worker (one thread per
# core) oversubscribes the machine; on 2 cores the default run took 9:51 that way and 4:09 with one thread each.
# (Set before torch is imported, for OpenMP; torch.set_num_threads below for a torch some plugin imported first.)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from syncfree.audit import audit, emulate_cuda


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a real CUDA device")
    config.addinivalue_line("markers", "slow: takes more than about 15 s; skipped by default, run them alone with -m slow")


# Each family's forward-parity matrix (its own layouts; the standard ones are the conformance suite's, which marks its
# own) runs with SDPA (Transformers' default attention) in the default run and with eager attention in the slow step,
# except the Qwen-VL families', which run both by default.
_EAGER_BY_DEFAULT = {"test_patch_qwen2.py", "test_patch_qwen35.py", "test_patch_api.py", "test_conformance.py"}


def _eager_parity_elsewhere(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return ((getattr(item, "originalname", None) or "").startswith("test_forward_") and "eager" in params.values()
            and item.path.name not in _EAGER_BY_DEFAULT)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _eager_parity_elsewhere(item):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a real CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def emulated():
    """Run a function on the emulated device and return the audit report of it."""

    def run(fn):
        with emulate_cuda(), audit() as report:
            fn()
        return report

    return run


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before and after the test (each compile test counts its own graphs), and the traced
    models' references freed."""
    import gc

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    gc.collect()
