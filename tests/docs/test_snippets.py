"""Every Python snippet of README.md and the site's pages (docs/**/*.md) runs as written.

The reports (docs/reports/) are records of what was run, not instructions, and are left out. The
```python blocks of one page run in order in one namespace (a later block may use an earlier
one's names), in a temporary working directory. A block that cannot run here is marked on the line
above its fence with ``<!-- snippet: not run (REASON) -->``, REASON one of ``NOT_RUN``: it still
parses (a ``signature`` need not: it shows a call's parameters) and every name it uses is bound
somewhere on its page or is a builtin, so a NameError such as ``router(hidden_states)`` without
``hidden_states`` is caught there too.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REPORTS = DOCS / "reports"
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if REPORTS not in p.parents)]
MARK = re.compile(r"<!-- snippet: not run \((.+?)\) -->")
# why a block may not run in the tests: a call's signature (not code); a model or data set from the
# Hugging Face Hub (no network in tests); a GPU; a training run of hours on a published model
NOT_RUN = ("signature", "downloads a model", "needs a GPU", "trains a published model for hours")


def snippets(page: Path) -> list[tuple[int, str, str | None]]:
    """(line, code, why not run or None) of each ```python block of ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i + 1, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            mark = MARK.search(lines[start - 2]) if start >= 2 else None
            out.append((start + 1, "\n".join(body) + "\n", mark.group(1) if mark else None))
        i += 1
    return out


def bound_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
            isinstance(node, ast.ExceptHandler) and node.name
        ):
            names.add(node.name)
    return names


def unbound(tree: ast.AST, bound: set[str]) -> set[str]:
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - bound - set(dir(builtins))


PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_snippet_runs_as_written(page, tmp_path, monkeypatch):
    blocks = snippets(page)
    if not blocks:
        pytest.skip("no Python snippets")
    trees = {line: ast.parse(code) for line, code, why in blocks if why != "signature"}
    bound = set().union(*map(bound_names, trees.values())) if trees else set()
    for line, _code, why in blocks:
        where = f"{page.relative_to(ROOT)}:{line}"
        assert why is None or why in NOT_RUN, f"{where}: 'not run ({why})' is not one of {NOT_RUN}"
        if why == "signature":
            continue
        missing = unbound(trees[line], bound)
        assert not missing, f"{where}: names bound nowhere on the page: {', '.join(sorted(missing))}"
    if page.name != "README.md" and all(why for _, _, why in blocks):
        return
    for tree in (trees[line] for line, _, why in blocks if why is None):  # an extra not installed here
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]:
                    if importlib.util.find_spec(name.split(".")[0]) is None:
                        pytest.skip(f"{page.name} imports {name}, which is not installed")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__snippet__"}
    for line, code, why in blocks:
        if why is None:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, f"{page.name}:{line}", "exec"), namespace)


def test_the_marks_are_rare():
    """Most snippets run: a mark is for what the tests cannot have (a GPU, the network, hours)."""
    blocks = [why for page in PAGES for _, _, why in snippets(page)]
    assert sum(why is None for why in blocks) >= len(blocks) // 3, blocks
