"""MkDocs hooks (mkdocs.yml names this file): the plots of benchmarks/results published beside the pages, as
``results/NAME.png``, and a warning (an error under ``mkdocs build --strict``) for each generated table that
differs from what ``python benchmarks/tables.py`` renders from the recorded results now."""

from __future__ import annotations

import glob
import importlib.util
import logging
import os

__all__ = ["on_pre_build", "on_files"]

_HERE = os.path.dirname(os.path.abspath(__file__))
log = logging.getLogger("mkdocs.hooks.syncfree")


def _tables():
    spec = importlib.util.spec_from_file_location("syncfree_tables", os.path.join(_HERE, "tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_pre_build(config, **kwargs) -> None:
    for line in _tables().stale():
        log.warning(f"out of date: {line} (run python benchmarks/tables.py)")


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    for path in sorted(glob.glob(os.path.join(_HERE, "results", "*.png"))):
        files.append(File.generated(config, f"results/{os.path.basename(path)}", abs_src_path=path))
    return files
