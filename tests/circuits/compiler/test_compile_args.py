"""compile_circuit's and compile_entry's ``cache_dir`` and ``force``: a wrong type is a one-line
ValueError naming the argument and the values allowed, before anything is compiled or cached
(issue 48, point 8)."""

from __future__ import annotations

import os
import pathlib

import pytest

import circuits
from circuits.compiler.compile import compile_entry

BAD_CACHE_DIRS = [123, 1.5, b"/tmp/x", "", ["dir"], True]
BAD_FORCES = ["yes", "no", 1, 0, None, 1.0]


@pytest.mark.parametrize("entry", [circuits.compile_circuit, compile_entry], ids=["compile_circuit", "compile_entry"])
@pytest.mark.parametrize("bad", BAD_CACHE_DIRS, ids=repr)
def test_a_cache_dir_not_a_path_is_refused_in_one_line(entry, bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written anywhere, not even under a str() of ``bad``
    with pytest.raises(ValueError) as info:
        entry(circuits.ExactlyK(6, 2), cache_dir=bad)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cache_dir must be None") and "os.PathLike" in message and repr(bad) in message
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("entry", [circuits.compile_circuit, compile_entry], ids=["compile_circuit", "compile_entry"])
@pytest.mark.parametrize("bad", BAD_FORCES, ids=repr)
def test_a_force_not_a_bool_is_refused_in_one_line(entry, bad, tmp_path):
    with pytest.raises(ValueError) as info:
        entry(circuits.ExactlyK(6, 2), cache_dir=tmp_path, force=bad)
    message = str(info.value)
    assert "\n" not in message
    assert message == f"force must be True or False, got {bad!r}"
    assert os.listdir(tmp_path) == []  # refused before the cache was touched


@pytest.mark.parametrize("as_path", [str, pathlib.Path], ids=["str", "Path"])
def test_good_cache_dir_and_force_still_work(as_path, tmp_path):
    spec = circuits.ExactlyK(6, 2)
    first = circuits.compile_circuit(spec, cache_dir=as_path(tmp_path))
    assert not first.info["cache_hit"] and first.info["cache_path"].startswith(str(tmp_path))
    assert circuits.compile_circuit(spec, cache_dir=as_path(tmp_path)).info["cache_hit"]
    forced = circuits.compile_circuit(spec, cache_dir=as_path(tmp_path), force=True)
    assert not forced.info["cache_hit"]
    assert compile_entry(spec, cache_dir=as_path(tmp_path), force=False).info["cache_hit"]


def test_the_default_cache_dir_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBMOE_CACHE", str(tmp_path))
    circuit = circuits.compile_circuit(circuits.ExactlyK(6, 2), cache_dir=None)
    assert circuit.info["cache_path"].startswith(str(tmp_path))
