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
