"""The documentation site: it builds with ``mkdocs build --strict`` (a broken link, anchor or API
reference fails), its API reference names every public name, its pages carry no lab notes (dates
of runs, load averages, issue numbers: those live in the reports), and its reports are named by
what, hardware and date and listed on the reports' index."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REPORTS = DOCS / "reports"
PAGES = sorted(p for p in DOCS.rglob("*.md") if REPORTS not in p.parents)
PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES]

# what a page may not say (a report may): a date such as 2026-11-26, a load average, an issue or
# pull-request number
LAB_NOTES = {
    "an ISO date": re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    "a load average": re.compile(r"load average", re.IGNORECASE),
    "an issue number": re.compile(r"\b(?:issues?|PR|pull request)\s*#?\d+|(?<![\w&#])#\d+\b", re.IGNORECASE),
}
REPORT_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*-\d{4}-\d{2}\.md$")  # what-hardware-YYYY-MM.md


def _hook():
    spec = importlib.util.spec_from_file_location("docs_api_hook", DOCS / "_hooks" / "api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_pages_carry_no_lab_notes(page):
    text = page.read_text(encoding="utf-8")
    found = [
        f"{what} on line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for what, pattern in LAB_NOTES.items()
        for m in pattern.finditer(text)
    ]
    assert not found, f"{page.relative_to(ROOT)} has {'; '.join(found)} (move it to a report in docs/reports/)"


def test_reports_are_named_by_what_hardware_and_date_and_listed():
    index = (REPORTS / "index.md").read_text(encoding="utf-8")
    reports = sorted(p.name for p in REPORTS.glob("*.md") if p.name != "index.md")
    assert reports
    for name in reports:
        assert REPORT_NAME.match(name), f"docs/reports/{name}: name it what-hardware-YYYY-MM.md"
        assert f"]({name})" in index, f"docs/reports/{name} is not listed in docs/reports/index.md"


def test_the_api_reference_names_every_public_name():
    """The hook that writes the API pages covers ``circuits.__all__`` and ``probmoe.__all__``."""
    import circuits
    import probmoe

    hook = _hook()
    for package, names in (("circuits", circuits.__all__), ("probmoe", probmoe.__all__)):
        shown = {path.rsplit(".", 1)[1] for path in hook.public_paths(package)}
        assert shown == set(names), f"{package}: API reference {sorted(shown ^ set(names))} differ from __all__"
    pages = "".join(p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md"))
    for package in ("circuits", "probmoe", "probmoe.integrations.transformers", "probmoe.integrations.torchtitan"):
        assert f"<!-- api: {package} -->" in pages, package


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None,
    reason="mkdocs and mkdocstrings-python are not installed (the docs extra)",
)
def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: a broken link, anchor, nav entry or API reference is an error."""
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "probmoe" / "index.html").exists()


def _packages(top: str) -> list[str]:
    """``top``'s subpackages, as folder paths relative to the repository (``circuits/dp``)."""
    return sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / top).rglob("__init__.py") if p.parent != ROOT / top)


def test_the_layouts_name_every_package():
    """The README's layout block and the circuits page's layout section are drawn from the tree:
    every subpackage of circuits/ and probmoe/ is named in them (a new one fails until it is)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").split("## Layout of the repository", 1)[1]
    circuits_page = (DOCS / "circuits.md").read_text(encoding="utf-8").split("## How the code is laid out", 1)[1]
    for folder in _packages("circuits") + _packages("probmoe"):
        name = folder.split("/", 1)[1] + "/"
        assert name in readme or name.rsplit("/", 2)[-2] + "/" in readme, f"README.md's layout lacks {folder}/"
    for folder in _packages("circuits"):
        assert folder.split("/", 1)[1] + "/" in circuits_page, f"docs/circuits.md's layout lacks {folder}/"


def test_the_circuits_layout_names_every_module():
    """docs/circuits.md's layout section names every module of circuits/ (by file name)."""
    section = (DOCS / "circuits.md").read_text(encoding="utf-8").split("## How the code is laid out", 1)[1]
    missing = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "circuits").rglob("*.py"))
        if p.name != "__init__.py" and p.name not in section
    ]
    assert not missing, f"docs/circuits.md's layout section lacks {', '.join(missing)}"


PATH_NAMED = re.compile(r"(?<![\w/.-])((?:circuits|probmoe|tools|tests)/[\w/.-]*[\w/])")
NAME_NAMED = re.compile(r"`((?:circuits|probmoe)(?:\.\w+)+)")
MADE_BY_COMMANDS = {"tools/gpu/wheels"}  # written by tools/gpu/wheels.sh, ignored by git


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module or an attribute path under one; True when a third-party
    package it needs (transformers, torchtitan, vllm, ...) is not installed here."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] not in ("circuits", "probmoe"):
                return True
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=["README.md", *PAGE_IDS])
def test_the_files_and_names_a_page_gives_exist(page):
    """A file, folder or Python name a page gives (``circuits/kernels/by_node.py``,
    ``circuits.passes.select``) exists: code moves, and the pages follow."""
    text = page.read_text(encoding="utf-8")
    missing = [
        p for p in sorted(set(PATH_NAMED.findall(text))) if p not in MADE_BY_COMMANDS and not (ROOT / p).exists()
    ]
    missing += [n for n in sorted(set(NAME_NAMED.findall(text))) if not _resolves(n)]
    assert not missing, f"{page.relative_to(ROOT)} names what is not there: {', '.join(missing)}"


def test_what_the_readme_tour_writes_is_ignored_by_git():
    """The folders the README's commands and snippets write (``--output-dir runs/p``, ``--output
    analysis/``, ``save_pretrained("ckpt")``) are in .gitignore: the tour leaves the clone clean."""
    if not (ROOT / ".git").exists() or subprocess.run(["git", "--version"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    written = re.findall(r"--output(?:-dir)? ([\w./-]+)|save_pretrained\(\"([\w./-]+)\"\)", text)
    folders = sorted({(a or b).strip("./").split("/")[0] for a, b in written})
    assert {"runs", "analysis"} <= set(folders), folders
    for folder in folders:
        check = subprocess.run(["git", "check-ignore", "-q", f"{folder}/any-file"], cwd=ROOT)
        assert check.returncode == 0, f"{folder}/ (written by the README's tour) is not in .gitignore"
