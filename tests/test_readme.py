"""The README's Python example runs as it stands (on a machine without a GPU, where it emulates one)."""

from __future__ import annotations

import pathlib
import re

import pytest

from syncfree.audit import real_cuda_available

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
MARKER = "<!-- tests/test_readme.py runs the next code block -->"


def _example() -> str:
    text = README.read_text()
    assert MARKER in text, "the README lost the example this test runs"
    after = text.split(MARKER, 1)[1]
    match = re.match(r"\s*```python\n(.*?)```", after, re.S)
    assert match, "the marker must be followed by a python code block"
    return match.group(1)


@pytest.mark.skipif(real_cuda_available(), reason="the example emulates a GPU; on a GPU machine drop that line")
def test_the_readme_example_runs(capsys):
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(_example(), str(README), "exec"), namespace)
    assert "total (emulated): 0 syncs" in capsys.readouterr().out
    assert not namespace["syncfree"].is_patched(namespace["model"])
