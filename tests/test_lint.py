"""The tree's rules, as CI checks them first: the import contracts (.importlinter: circuits in
layers, no import cycle, circuits free of probmoe, probmoe's core free of transformers) and ruff's
lint and format settings (pyproject.toml). Each is skipped where its tool is not installed (the
lint extra installs both)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*command):
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed (pip install -e '.[lint]')")
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_are_kept():
    done = run("lint-imports")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    "command", [("ruff", "check", "."), ("ruff", "format", "--check", ".")], ids=["check", "format"]
)
def test_ruff_is_clean(command):
    done = run(*command)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
