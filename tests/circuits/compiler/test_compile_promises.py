"""probmoe-compile says what will happen (issue 42, point 5.8): with a cache that cannot be
written the evaluator line names the temporary folder the C passes are built into, and they are
built there (not the torch fallback with warnings); --cnf's help names d4's d-DNNF."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("compiler", [True, False], ids=["with-cc", "without-cc"])
def test_the_evaluator_line_names_a_wheels_prebuilt_library(tmp_path, monkeypatch, compiler):
    """A wheel's library for this CPU's ISA, built from these sources, is what the passes load
    (first, compiler or not): the line names it, not a first-use build."""
    monkeypatch.delenv("PROBMOE_NATIVE", raising=False)
    isa = build.chosen_isa()[0]
    if isa is None or not build.runs_prebuilt(isa):
        pytest.skip("no ISA here that a wheel ships a library for")
    folder = tmp_path / "prebuilt"
    (folder / isa).mkdir(parents=True)
    (folder / isa / "libkernels.json").write_text(json.dumps({"sources": ROWS.sources_digest()}))
    monkeypatch.setattr(ROWS, "prebuilt", folder)
    if not compiler:
        monkeypatch.setattr(build, "_compiler", lambda: None)
    assert report.evaluator() == f"fused C passes ({isa}, prebuilt in the installed package: {folder / isa})"
    (folder / isa / "libkernels.json").write_text(json.dumps({"sources": "other sources"}))  # stale: not loaded
    line = report.evaluator()
    if compiler:
        assert line.startswith(f"fused C passes ({isa}, built on first use into "), line
    else:
        assert line == f"torch passes (C passes unavailable: {build.NO_COMPILER})"


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
