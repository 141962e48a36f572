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
from references import MADE_BY_COMMANDS, resolves

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


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=["README.md", *PAGE_IDS])
def test_the_files_and_names_a_page_gives_exist(page):
    """A file, folder or Python name a page gives (``circuits/kernels/by_node.py``,
    ``circuits.kernels.select.select``) exists: code moves, and the pages follow."""
    text = page.read_text(encoding="utf-8")
    missing = [
        p
        for p in sorted(set(PATH_NAMED.findall(text)))
        if not p.startswith(MADE_BY_COMMANDS) and not (ROOT / p).exists()
    ]
    resolved = {n: resolves(n) for n in sorted(set(NAME_NAMED.findall(text)))}
    missing += [n for n, found in resolved.items() if found is False]
    assert not missing, f"{page.relative_to(ROOT)} names what is not there: {', '.join(missing)}"
    unchecked = {n: found for n, found in resolved.items() if isinstance(found, str)}
    if unchecked:
        pytest.skip(
            "the rest exists; not checked, their optional package not installed here: "
            + ", ".join(f"{n} ({package})" for n, package in unchecked.items())
        )


HIDE_TORCHTITAN = """
import importlib.abc, importlib.metadata as md, sys
import pytest
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchtitan":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
version = md.version
def hidden_version(name):
    if name == "torchtitan":
        raise md.PackageNotFoundError(name)
    return version(name)
md.version = hidden_version
sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_a_page_naming_an_uninstalled_integration_is_skipped_with_the_reason():
    """Where torchtitan is not installed (the README's test install), the scale-out page's
    ``probmoe.integrations.torchtitan`` names cannot be imported: its test skips, naming them and
    the package, once every other name and file it gives is found (here torchtitan is hidden)."""
    page = "tests/docs/test_site.py::test_the_files_and_names_a_page_gives_exist[docs/scale-out.md]"
    run = subprocess.run(
        [sys.executable, "-c", HIDE_TORCHTITAN, "-q", "-rs", "-p", "no:cacheprovider", page],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "1 skipped" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    assert "not installed here: probmoe.integrations.torchtitan (torchtitan)" in run.stdout, run.stdout[-3000:]


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


def _readme_set_up() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8").split("## Set up", 1)[1].split("\n## ", 1)[0]


def test_ci_runs_the_readme_test_command_as_written():
    """The README's test line is the whole set-up of the default suite: .ci/run runs that very line
    (in a subshell, so that a failed step stops CI under set -e), before it installs anything more
    (torchtitan, Megatron-Core) for the suites that need them."""
    section = _readme_set_up()
    command = section.split("Install and run the tests:", 1)[1].strip().splitlines()[0].strip()
    assert command.endswith("&& python -m pytest"), command
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert f"({command})" in ci, f".ci/run does not run README.md's test command {command!r} in a subshell"
    before = [line for line in ci[: ci.index(f"({command})")] if line.startswith("pip install")]
    assert all(line.split()[2:] == ['"ruff==0.17.5"'] for line in before), before  # only the style check's ruff


def test_the_readme_says_which_torch_build_pip_installs():
    """``pip install torch==2.13.0`` from PyPI is the CUDA build; the README says so, with the command
    for the CPU build, and keeps its two set-up lines as they were."""
    section = _readme_set_up()
    assert "first installs the CPU wheel" not in section
    assert "CUDA build" in section
    assert "    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu\n" in section
    assert "    pip install torch==2.13.0 && pip install -e . && probmoe-compile --n 64 --k 8\n" in section
