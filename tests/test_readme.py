"""The README's Python examples run as they stand (on a machine without a GPU, where it emulates one)."""

from __future__ import annotations

import pathlib
import re

import pytest

from syncfree.audit import real_cuda_available

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
MARKER = "<!-- tests/test_readme.py runs the next code block -->"


def _examples() -> list[str]:
    text = README.read_text()
    assert MARKER in text, "the README lost the examples this test runs"
    blocks = []
    for after in text.split(MARKER)[1:]:
        match = re.match(r"\s*```python\n(.*?)```", after, re.S)
        assert match, "each marker must be followed by a python code block"
        blocks.append(match.group(1))
    return blocks


@pytest.mark.skipif(real_cuda_available(), reason="the examples emulate a GPU; on a GPU machine drop that line")
@pytest.mark.parametrize("index", range(len(_examples())))
def test_the_readme_examples_run(index, capsys):
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(_examples()[index], str(README), "exec"), namespace)
    assert "total (emulated): 0 syncs" in capsys.readouterr().out
    assert not namespace["syncfree"].is_patched(namespace["model"])
