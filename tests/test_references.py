"""The names and files the code's docstrings and comments cite exist: every dotted name of circuits,
probmoe or probmoe_commands in double backticks resolves (a module, then its attributes), and every
repository path (circuits/..., probmoe/..., tools/..., tests/..., docs/...) is a file or folder. A
moved module leaves no reference behind (two were found when this test was written)."""

import re
from pathlib import Path

import pytest
from references import MADE_BY_COMMANDS, resolves

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("circuits", "probmoe", "probmoe_commands")
DOTTED = re.compile(r"``((?:circuits|probmoe|probmoe_commands)(?:\.[A-Za-z_]\w*)+)``")
PATH = re.compile(r"(?<![\w/.])((?:circuits|probmoe|probmoe_commands|tools|tests|docs)/[\w/.-]*\w)")
SOURCES = sorted(p for d in (*PACKAGES, "tools", "tests") for p in (ROOT / d).rglob("*.py"))


def test_the_dotted_names_cited_exist():
    cited = {m.group(1): p for p in SOURCES for m in DOTTED.finditer(p.read_text(encoding="utf-8"))}
    assert len(cited) > 100  # the pattern finds the citations
    # resolves: True, False, or the optional package (not installed here) that would tell
    stale = {name: str(p.relative_to(ROOT)) for name, p in cited.items() if resolves(name) is False}
    assert not stale, stale


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_paths_cited_exist(source):
    text = source.read_text(encoding="utf-8")
    stale = []
    for m in PATH.finditer(text):
        path = m.group(1).rstrip(".")
        if "*" in path or "{" in path or path.endswith("/x.py") or path.startswith(MADE_BY_COMMANDS):  # globs,
            continue  # templates, a test's made-up file, build outputs
        if not (ROOT / path).exists():
            stale.append(path)
    assert not stale, stale
