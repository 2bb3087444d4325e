"""Shared fixtures. Tests that need a real GPU carry the ``gpu`` marker and are skipped without one;
everything else runs on a CPU-only machine through the emulated device."""

from __future__ import annotations

import pytest
import torch

from syncfree.audit import audit, emulate_cuda


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a real CUDA device")
    config.addinivalue_line("markers", "slow: takes more than about 15 s; skipped by default, run them alone with -m slow")


def pytest_collection_modifyitems(config, items):
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
