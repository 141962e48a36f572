"""probmoe-compile says what will happen (issue 42, point 5.8): with a cache that cannot be
written the evaluator line names the temporary folder the C passes are built into, and they are
built there (not the torch fallback with warnings); --cnf's help names d4's d-DNNF."""

from __future__ import annotations

import warnings

import pytest

from circuits.inspect import cli, report
from circuits.kernels import build
from circuits.kernels.library import LIBRARY as ROWS


@pytest.fixture
def unusable_cache(tmp_path, monkeypatch):
    """PROBMOE_CACHE naming a regular file: nothing can be made under it (even by root)."""
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    monkeypatch.setenv("PROBMOE_CACHE", str(path))
    return path


def test_the_evaluator_line_names_the_temporary_folder(unusable_cache, monkeypatch):
    monkeypatch.delenv("PROBMOE_NATIVE", raising=False)
    isa = build.choice()[1]
    if isa is None:
        pytest.skip("no C compiler or known ISA here: the line names the torch passes")
    line = report.evaluator()
    assert line == (
        f"fused C passes ({isa}, built on first use into a temporary folder for each process: "
        f"{unusable_cache / 'native'} is not writable)"
    )


def test_the_c_library_is_built_in_a_temporary_folder_without_warnings(unusable_cache):
    isas = build.runnable_isas()
    if not isas or build._compiler() is None:
        pytest.skip("no C compiler or known ISA here")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lib = ROWS.variant(isas[-1])  # built for this cache directory (the portable one: the quickest)
    assert lib is not None


def test_writable_checks_without_making_folders(tmp_path):
    assert build.writable(tmp_path / "not" / "yet") and not (tmp_path / "not").exists()
    (tmp_path / "f").write_text("")
    assert not build.writable(tmp_path / "f" / "native")


def test_cnf_help_names_d4_and_the_d_dnnf():
    (cnf,) = [a.help for a in cli._parser("probmoe-compile", "")._actions if "--cnf" in a.option_strings]
    assert "d4" in cnf and "d-DNNF" in cnf and "vtree" not in cnf
