"""README.md and docs/ say what the code does: their Python examples run, their tables are the recorded results,
their command lines parse, and the README stays a two-minute read.

Every ```python block of a page runs, in order, in one namespace per page (later blocks use what earlier ones
made). A comment on the line before a block changes that:

    <!-- docs-test: skip (REASON) -->   not run (a fragment); the reason is required
    <!-- docs-test: slow -->            the page's test carries the ``slow`` marker
    <!-- docs-test: gpu -->             the page's test carries the ``gpu`` marker (needs a real GPU)

and anywhere in a page of notes whose code blocks are excerpts, not examples:

    <!-- docs-test: no examples (REASON) -->
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shlex
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
# Pages about the product: no word of how it was made (the developers' section may keep its planning notes).
PRODUCT_PAGES = [p for p in PAGES if "developers" not in p.relative_to(ROOT).parts]
README_MAX_LINES = 250

_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.S | re.M)
_MARKER = re.compile(r"<!-- docs-test: (?P<what>skip|slow|gpu)(?: \((?P<why>[^)]+)\))? -->")
# A page of notes whose code blocks are excerpts, not examples: none of its blocks runs.
_NOT_EXAMPLES = re.compile(r"<!-- docs-test: no examples \((?P<why>[^)]+)\) -->")


@dataclass
class Block:
    page: pathlib.Path
    line: int
    lang: str
    code: str
    marker: str | None


def _blocks(page: pathlib.Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.fullmatch(before.strip())
        if marker and marker["what"] == "skip":
            assert marker["why"], f"{page.name}: a skipped block must say why: <!-- docs-test: skip (REASON) -->"
        found.append(Block(page, text.count("\n", 0, m.start()) + 2, m["lang"], m["code"],
                           marker["what"] if marker else None))
    return found


def _name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def _runnable(page: pathlib.Path) -> list[Block]:
    if _NOT_EXAMPLES.search(page.read_text()):
        return []
    return [b for b in _blocks(page) if b.lang == "python" and b.marker != "skip"]


def _page_params():
    params = []
    for page in PAGES:
        blocks = _runnable(page)
        if not blocks:
            continue
        marks = [getattr(pytest.mark, what) for what in ("slow", "gpu") if any(b.marker == what for b in blocks)]
        params.append(pytest.param(page, marks=marks, id=_name(page)))
    return params


def _tables():
    spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", _page_params())
def test_the_python_examples_of_a_page_run_in_order_and_their_asserts_hold(page):
    import syncfree
    from syncfree.audit import real_cuda_available

    blocks = _runnable(page)
    if real_cuda_available() and any("emulate_cuda()" in b.code for b in blocks):
        pytest.skip("the examples emulate a GPU; on a GPU machine drop that line")
    assert any("assert" in b.code for b in blocks), f"{_name(page)}: no example states what it shows (assert)"
    from syncfree import families  # noqa: F401  (the registry, filled before it is kept)
    from syncfree.plan.registry import REGISTRY

    namespace: dict = {"__name__": "docs_example"}
    tables = (REGISTRY.families, REGISTRY.layouts, REGISTRY.inputs)
    before = [dict(table) for table in tables]
    try:
        for block in blocks:
            # Line numbers in a traceback are the page's own.
            code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
            exec(code, namespace)
    finally:
        syncfree.unpatch()  # a page that patched the classes leaves nothing behind for the next test
        for table, kept in zip(tables, before):  # (nor a family it registered: docs/developers/adding-a-family.md)
            table.clear()
            table.update(kept)


def test_the_generated_tables_are_what_the_recorded_results_give():
    tables = _tables()
    names = {(path, name) for path, name, _ in tables.blocks()}
    assert {("README.md", "support"), ("README.md", "headlines"), ("docs/families.md", "families")} <= names
    assert tables.stale() == [], "run python benchmarks/tables.py and commit the result"


def test_every_family_of_the_census_is_in_the_readme_and_the_families_page():
    tables = _tables()
    rows = json.loads((ROOT / "benchmarks" / "results" / "census.json").read_text())["rows"]
    bodies = {(path, name): body for path, name, body in tables.blocks()}
    families_table, support_table = bodies[("docs/families.md", "families")], bodies[("README.md", "support")]
    for row in rows:
        assert f"(`{row['family']}`) |" in families_table, f"docs/families.md does not list {row['family']}"
        assert tables.display_name(row["family"]) in support_table, f"README.md does not list {row['family']}"


def test_the_readme_is_a_two_minute_read():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {README_MAX_LINES})"
    words = len(README.read_text().split())  # (as wc -w counts them)
    assert words <= 1200, f"README.md has {words} words; move detail into docs/ (at most 1,200)"


@pytest.mark.parametrize("page", PRODUCT_PAGES, ids=_name)
def test_a_product_page_describes_the_product_not_how_it_was_made(page):
    hits = [line for line in page.read_text().splitlines() if re.search(r"issue [0-9]|session|this machine", line, re.I)]
    assert hits == [], f"{_name(page)}: {hits[0][:120]}"


def _command_lines() -> list[tuple[str, str, bool]]:
    """(page, command, whole) for every ``syncfree COMMAND ...`` line of a bash block (whole: it must parse as it
    stands), and every inline `syncfree ...` without placeholders (UPPER-CASE words, [optional] parts), which may
    name a command and some of its options only."""
    found = []
    for page in PAGES:
        for block in _blocks(page):
            if block.lang == "bash":
                found += [(_name(page), line.split("  #")[0].strip(), True) for line in block.code.splitlines()
                          if line.startswith("syncfree ")]
        for inline in re.findall(r"`(syncfree [a-z][^`]*)`", page.read_text()):
            if "[" not in inline and not re.search(r"\b[A-Z][A-Z_]*\b", inline):
                found.append((_name(page), inline, False))
    return sorted(set(found))


def test_every_command_line_in_the_docs_parses(capsys):
    from syncfree.cli.main import _parser

    commands = _command_lines()
    assert len({c.split()[1] for _, c, _ in commands}) >= 6  # demo, audit, bench, census, patch, doctor at least
    for page, command, whole in commands:
        parser = _parser()
        argv = shlex.split(command)[1:]
        parser._argv = argv
        try:
            parser.parse_args(argv)
        except SystemExit as exit:
            error = capsys.readouterr().err
            if whole or "the following arguments are required" not in error:
                pytest.fail(f"{page}: `{command}` does not parse (exit {exit.code}): {error.strip()}")


def test_the_command_line_page_lists_every_preset():
    from syncfree.presets import PRESETS

    cli = (DOCS / "cli.md").read_text()
    missing = [name for name in PRESETS if f"`{name}`" not in cli]
    assert missing == [], f"docs/cli.md does not list the presets {missing}"


def test_the_readme_s_links_lead_to_files_of_the_repository():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links to no page of the documentation"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"
