"""Loading the client examples (``examples/*.py``) as modules, for the tests that run them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["EXAMPLES", "load_example"]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    """``examples/<name>.py`` as a module (each example puts its own folder on ``sys.path`` for its helpers)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
