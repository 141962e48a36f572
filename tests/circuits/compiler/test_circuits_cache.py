"""The disk cache: hits, and every kind of bad entry detected, warned about and recompiled."""

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from pysdd.sdd import SddManager, Vtree

import circuits
from circuits.compiler import cache

SPEC = circuits.RangeK(10, 2, 5)
R = torch.randn(4, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _truth():
    return circuits.compile_circuit(SPEC, cache_dir=None, force=True).marginals(R)


def _fresh(tmp_path):
    c = circuits.compile_circuit(SPEC, cache_dir=tmp_path)
    assert not c.info["cache_hit"]
    return cache.entry_dir(SPEC, tmp_path)


def test_cold_then_hit(tmp_path):
    cold = circuits.compile_circuit(circuits.ExactlyK(64, 8), cache_dir=tmp_path)
    hot = circuits.compile_circuit(circuits.ExactlyK(64, 8), cache_dir=tmp_path)
    assert not cold.info["cache_hit"] and hot.info["cache_hit"]
    assert cold.info["cache_path"] == hot.info["cache_path"]
    assert int(hot.info["model_count"]) == math.comb(64, 8)
    assert hot.sizes() == cold.sizes()
    manifest = cache.entry_dir(circuits.ExactlyK(64, 8), tmp_path) / "manifest.json"
    stale = json.loads(manifest.read_text())
    stale["compile_seconds"] = -1.0  # still a valid entry
    manifest.write_text(json.dumps(stale))
    forced = circuits.compile_circuit(circuits.ExactlyK(64, 8), cache_dir=tmp_path, force=True)
    assert not forced.info["cache_hit"]
    assert json.loads(manifest.read_text())["compile_seconds"] >= 0  # force overwrites


def test_default_location_honours_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBMOE_CACHE", str(tmp_path / "a"))
    assert cache.default_cache_dir() == tmp_path / "a"
    monkeypatch.setenv("PROBMOE_CACHE", "~/probmoe-x")
    assert cache.default_cache_dir() == __import__("pathlib").Path.home() / "probmoe-x"
    monkeypatch.delenv("PROBMOE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    assert cache.default_cache_dir() == tmp_path / "b" / "probmoe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.default_cache_dir() == __import__("pathlib").Path.home() / ".cache" / "probmoe"


def _truncate(entry):
    f = entry / "layout.npz"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip(entry):
    f = entry / "layout.npz"
    data = bytearray(f.read_bytes())
    for i in range(100, len(data), 97):
        data[i] ^= 0xFF
    f.write_bytes(bytes(data))


def _garbage(entry):
    (entry / "manifest.json").write_bytes(os.urandom(300))


def _old_format(entry):
    m = json.loads((entry / "manifest.json").read_text())
    m["format_version"] = 0
    (entry / "manifest.json").write_text(json.dumps(m))


def _forged(entry):
    """A changed layout whose checksum was updated too: the structural checks must catch it."""
    with np.load(entry / "layout.npz") as z:
        arrays = dict(z)
    arrays["children"][arrays["children"] == 2] = 3  # x0 becomes x1
    np.savez(entry / "layout.npz", **arrays)
    m = json.loads((entry / "manifest.json").read_text())
    m["sha256"]["layout.npz"] = cache._sha256(entry / "layout.npz")
    (entry / "manifest.json").write_text(json.dumps(m))


def _wrong_spec(entry):
    other = circuits.compile_circuit(circuits.RangeK(10, 2, 6), cache_dir=entry.parent)
    src = cache.entry_dir(other.spec, entry.parent)
    for f in src.iterdir():
        (entry / f.name).write_bytes(f.read_bytes())


def _missing_file(entry):
    (entry / "layout.npz").unlink()


@pytest.mark.parametrize("damage", [_truncate, _flip, _garbage, _old_format, _forged, _wrong_spec, _missing_file])
def test_bad_entry_is_detected_and_recompiled(tmp_path, damage):
    entry = _fresh(tmp_path)
    damage(entry)
    with pytest.warns(circuits.CacheWarning, match="invalid"):
        c = circuits.compile_circuit(SPEC, cache_dir=tmp_path)
    assert not c.info["cache_hit"]
    torch.testing.assert_close(c.marginals(R), _truth())
    again = circuits.compile_circuit(SPEC, cache_dir=tmp_path)  # repaired: a clean hit
    assert again.info["cache_hit"]


def test_old_format_warning_names_the_version(tmp_path):
    entry = _fresh(tmp_path)
    _old_format(entry)
    with pytest.warns(circuits.CacheWarning, match="format version 0"):
        circuits.compile_circuit(SPEC, cache_dir=tmp_path)


def test_unwritable_directory_compiles_in_memory(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    with pytest.warns(circuits.CacheWarning, match="not writable"):
        c = circuits.compile_circuit(SPEC, cache_dir=blocker / "cache")
    assert c.info["cache_path"] is None
    torch.testing.assert_close(c.marginals(R), _truth())


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory_compiles_in_memory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.warns(circuits.CacheWarning, match="not writable"):
            c = circuits.compile_circuit(SPEC, cache_dir=ro)
        torch.testing.assert_close(c.marginals(R), _truth())
    finally:
        ro.chmod(0o700)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_directory_not_even_root_can_write_compiles_in_memory():
    """/proc refuses new entries to every user, root included (CI runs as root)."""
    with pytest.warns(circuits.CacheWarning, match="not writable"):
        c = circuits.compile_circuit(SPEC, cache_dir="/proc/probmoe-cache")
    assert c.info["cache_path"] is None
    torch.testing.assert_close(c.marginals(R), _truth())


def test_read_only_entry_still_loads(tmp_path):
    entry = _fresh(tmp_path)
    for f in entry.iterdir():
        f.chmod(0o444)
    entry.chmod(0o555)
    try:
        c = circuits.compile_circuit(SPEC, cache_dir=tmp_path)
        assert c.info["cache_hit"]
    finally:
        entry.chmod(0o755)


def test_direct_entry_holds_the_layout_only(tmp_path):
    spec = circuits.ExactlyK(12, 4)
    circuits.compile_circuit(spec, cache_dir=tmp_path)
    entry = cache.entry_dir(spec, tmp_path)
    assert sorted(f.name for f in entry.iterdir()) == ["layout.npz", "manifest.json"]
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["compiler"] == "direct" and manifest["format_version"] == cache.FORMAT_VERSION


def test_pysdd_entry_holds_pysdd_files_and_dot(tmp_path):
    spec = circuits.ExactlyK(12, 4)
    c = circuits.compile_circuit(spec, cache_dir=tmp_path, compiler="pysdd")
    entry = cache.entry_dir(spec, tmp_path, "pysdd")
    assert c.info["cache_path"] == str(entry) and entry.name == "exactly-n12-k4-pysdd"
    mgr = SddManager.from_vtree(Vtree.from_file(str(entry / "circuit.vtree").encode()))
    root = mgr.read_sdd_file(str(entry / "circuit.sdd").encode())
    assert root.global_model_count() == math.comb(12, 4)
    assert (entry / "circuit.dot").read_text().lstrip().startswith("digraph")
    manifest = json.loads((entry / "manifest.json").read_text())
    for key in ("format_version", "spec", "pysdd_version", "sizes", "log_model_count", "sha256"):
        assert key in manifest
    assert manifest["log_model_count"] == pytest.approx(math.log(math.comb(12, 4)))
    with np.load(entry / "layout.npz", allow_pickle=False) as z:  # plain arrays, no pickle
        assert set(z.files) == {"n", "groups", "children", "implicit"}


def _as_written_by_format_2(entry):
    """Rewrite a pysdd entry as the previous release wrote it: format 2, no compiler field, at the
    spec's own key (that release had one compiler)."""
    m = json.loads((entry / "manifest.json").read_text())
    m["format_version"] = 2
    del m["compiler"]
    (entry / "manifest.json").write_text(json.dumps(m))
    target = entry.parent / entry.name.removesuffix("-pysdd")
    entry.rename(target)
    return target


def test_format_2_entry_is_rebuilt_with_one_warning(tmp_path):
    spec = circuits.RangeK(12, 3, 6)
    circuits.compile_circuit(spec, cache_dir=tmp_path, compiler="pysdd")
    old = _as_written_by_format_2(cache.entry_dir(spec, tmp_path, "pysdd"))
    assert old == cache.entry_dir(spec, tmp_path)
    with pytest.warns(circuits.CacheWarning) as caught:
        c = circuits.compile_circuit(spec, cache_dir=tmp_path)
    assert len(caught) == 1 and "format version 2, this probmoe reads 3" in str(caught[0].message)
    assert not c.info["cache_hit"] and c.info["compiler"] == "direct"
    again = circuits.compile_circuit(spec, cache_dir=tmp_path)
    assert again.info["cache_hit"]
    assert sorted(f.name for f in old.iterdir()) == ["layout.npz", "manifest.json"]


def test_compilers_have_their_own_entries(tmp_path):
    spec = circuits.ExactlyK(10, 3)
    direct = circuits.compile_circuit(spec, cache_dir=tmp_path)
    by_pysdd = circuits.compile_circuit(spec, cache_dir=tmp_path, compiler="pysdd")
    assert direct.info["cache_path"] != by_pysdd.info["cache_path"]
    assert circuits.compile_circuit(spec, cache_dir=tmp_path, compiler="pysdd").info["cache_hit"]
    assert circuits.compile_circuit(spec, cache_dir=tmp_path, compiler="direct").info["cache_hit"]
    torch.testing.assert_close(direct.marginals(R), by_pysdd.marginals(R))
    with pytest.raises(ValueError, match="compiler must be one of 'direct', 'pysdd' for ExactlyK"):
        circuits.compile_circuit(spec, cache_dir=tmp_path, compiler="d4")


WORKER = textwrap.dedent(
    """
    import json, os, sys, time, warnings
    warnings.simplefilter("error")  # any cache warning fails the worker
    go = sys.argv[2]
    while not os.path.exists(go):
        time.sleep(0.001)
    import torch, circuits
    c = circuits.compile_circuit(circuits.ExactlyK(96, 12), cache_dir=sys.argv[1])
    r = torch.linspace(-3, 3, 96, dtype=torch.float64)
    print(json.dumps({"hit": c.info["cache_hit"], "m": c.marginals(r).tolist()}))
    """
)


@pytest.mark.parametrize("processes", [3, pytest.param(8, marks=pytest.mark.slow)])
def test_processes_compile_the_same_spec(tmp_path, processes):
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path / "cache"), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    want = circuits.compile_circuit(circuits.ExactlyK(96, 12), cache_dir=None, force=True).marginals(
        torch.linspace(-3, 3, 96, dtype=torch.float64)
    )
    for res in results:
        torch.testing.assert_close(torch.tensor(res["m"], dtype=torch.float64), want)
    entry = cache.entry_dir(circuits.ExactlyK(96, 12), tmp_path / "cache")
    cache.read_entry(entry)  # one valid entry, no leftovers
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [entry.name]
