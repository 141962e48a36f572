"""probmoe-compile and probmoe-inspect, run as subprocesses (the installed console scripts).

Each process pays the torch import (~1.5 s), so independent commands run concurrently.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import circuits
from circuits.compiler.cache import read_entry
from circuits.inspect.cli import compile_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}


def _command(script: str, func: str) -> list[str]:
    """The console script installed beside this interpreter, else the same function via -c."""
    path = Path(sysconfig.get_path("scripts")) / script
    if path.is_file():
        return [str(path)]
    return [sys.executable, "-c", f"from circuits.inspect.cli import {func}; raise SystemExit({func}())"]


COMPILE = _command("probmoe-compile", "compile_main")
INSPECT = _command("probmoe-inspect", "inspect_main")


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", env=ENV, timeout=120)


def run_all(cmds: dict) -> dict:
    """Run the commands concurrently; their CompletedProcess by name."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(run, cmd) for name, cmd in cmds.items()}
        return {name: f.result() for name, f in futures.items()}


def table_rows(text: str) -> list[str]:
    """The rows of the level table: the lines after its header up to the first blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("level  nodes"))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line)
    return rows


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli-cache")


@pytest.fixture(scope="module")
def cold(cache_dir):
    return run([*COMPILE, "--n", "64", "--k", "8", "--cache-dir", str(cache_dir)])


def test_compile_cold_run_reports_and_caches(cold, cache_dir):
    assert cold.returncode == 0, cold.stderr
    out = cold.stdout
    entry = cache_dir / "exactly-n64-k8"
    assert "compiled ExactlyK(n=64, k=8)" in out
    assert "4426165368" in out and "checked against math.comb" in out
    assert (entry / "manifest.json").is_file() and str(entry) in out
    layout, _ = read_entry(entry)
    assert len(table_rows(out)) == len(layout.levels())
    assert f"{layout.sizes()['levels']} levels" in out


def test_compile_second_run_is_a_cache_hit(cold, cache_dir):
    assert cold.returncode == 0
    hit = run([*COMPILE, "--n", "64", "--k", "8", "--cache-dir", str(cache_dir)])
    assert hit.returncode == 0, hit.stderr
    assert hit.stdout.startswith("cache hit") and "4426165368" in hit.stdout
    assert hit.stderr == ""


def test_compile_json_range(cache_dir):
    res = run([*COMPILE, "--n", "64", "--kmin", "4", "--kmax", "8", "--json", "--cache-dir", str(cache_dir)])
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)
    assert int(facts["model_count"]) == sum(math.comb(64, j) for j in range(4, 9))
    assert facts["model_count_checked"] and not facts["cache_hit"]
    assert facts["spec"]["describe"] == "RangeK(n=64, kmin=4, kmax=8)"
    assert len(facts["levels"]) == facts["sizes"]["levels"]
    assert Path(facts["cache_path"]).is_dir()


BAD = {
    "k above n": (["--n", "64", "--k", "65"], "--k must be in [0, n = 64]"),
    "kmin above kmax": (["--n", "64", "--kmin", "5", "--kmax", "3"], "--kmin must be in [0, kmax = 3]"),
    "kmax above n": (["--n", "8", "--kmax", "9"], "--kmax must be in [0, n = 8]"),
    "k with a range": (["--n", "64", "--k", "8", "--kmin", "2"], "--k cannot be combined"),
    "missing n": (["--k", "8"], "--n is required"),
    "negative n": (["--n", "-3", "--k", "1"], "--n must be in [1, inf]"),
    "negative k": (["--n", "64", "--k", "-1"], "--k must be in [0, n = 64]"),
    "neither k nor range": (["--n", "64"], "give --k K"),
    "nothing": ([], "give a circuit"),
    "not an int": (["--n", "x", "--k", "1"], "argument --n"),
    "unreadable cnf": (["--cnf", "/nonexistent/f.cnf"], "--cnf: /nonexistent/f.cnf: unreadable"),
    "sdd without vtree": (["--sdd", __file__], "--sdd and --vtree must be given together"),
    "not dimacs": (["--cnf", __file__], "before the 'p cnf' header"),
    "spec not json": (["--spec", "k=8"], '--spec must be a JSON object such as \'{"type": "ExactlyK"'),
    "spec out of range": (["--spec", '{"type": "ExactlyK", "n": 4, "k": 5}'], "--spec: k must be in [0, n = 4]"),
    "spec of a file": (["--spec", '{"type": "CnfFile", "digest": "x"}'], "--spec: a constraint spec's type must be"),
    "spec and flags": (["--spec", '{"type": "ExactlyK", "n": 4, "k": 2}', "--n", "4"], "give only one circuit"),
}


# Run as subprocesses too (the rest only in-process, to keep this file fast).
BAD_SUBPROCESS = ("k above n", "missing n", "not an int", "unreadable cnf")


@pytest.mark.parametrize("name", BAD)
def test_bad_arguments_in_process(name, capsys, cache_dir):
    args, message = BAD[name]
    with pytest.raises(SystemExit) as exc:
        compile_main([*args, "--cache-dir", str(cache_dir)])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("probmoe-compile: error: ") and message in err


@pytest.fixture(scope="module")
def bad_and_warned(cache_dir):
    """Some bad-argument runs, plus a compile over a corrupted cache entry, run concurrently."""
    circuits.compile_circuit(circuits.ExactlyK(8, 2), cache_dir=cache_dir)
    npz = cache_dir / "exactly-n8-k2" / "layout.npz"
    npz.write_bytes(npz.read_bytes()[:-7])
    cmds = {name: [*COMPILE, *BAD[name][0], "--cache-dir", str(cache_dir)] for name in BAD_SUBPROCESS}
    cmds["corrupt entry"] = [*COMPILE, "--n", "8", "--k", "2", "--cache-dir", str(cache_dir)]
    cmds["inspect png without output"] = [*INSPECT, "--n", "6", "--k", "3", "--format", "png"]
    cmds["inspect bad entry"] = [*INSPECT, "--entry", str(cache_dir / "nothing-here")]
    return run_all(cmds)


@pytest.mark.parametrize("name", [*BAD_SUBPROCESS, "inspect png without output", "inspect bad entry"])
def test_bad_arguments_exit_2_with_one_line(bad_and_warned, name):
    res = bad_and_warned[name]
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith(("probmoe-compile: error: ", "probmoe-inspect: error: "))
    if name in BAD:
        assert BAD[name][1] in res.stderr


def test_cache_warning_is_one_line(bad_and_warned):
    res = bad_and_warned["corrupt entry"]
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("compiled ExactlyK(n=8, k=2)")
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("probmoe-compile: warning: probmoe cache entry") and "recompiling" in line


@pytest.fixture(scope="module")
def inspected(cache_dir, cold, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-out")
    cd = ["--cache-dir", str(cache_dir)]
    small, rng = ["--n", "6", "--k", "3", *cd], ["--n", "6", "--kmin", "2", "--kmax", "4", *cd]
    cnf = out / "f.cnf"
    cnf.write_text("c x1 or x2, not x1 or x3\np cnf 3 2\n1 2 0\n-1 3 0\n")
    cmds = {
        "cnf json": [*COMPILE, "--cnf", str(cnf), "--json", *cd],
        "text": [*INSPECT, "--n", "64", "--k", "8", *cd],
        "text small": [*INSPECT, *rng],
        "entry": [*INSPECT, "--entry", str(cache_dir / "exactly-n64-k8")],
        "dot": [*INSPECT, *small, "--format", "dot"],
        "png": [*INSPECT, *small, "--format", "png", "--output", str(out / "e63.png")],
        "svg": [*INSPECT, *rng, "--output", str(out / "r624.svg")],
        "summary n64": [*INSPECT, "--n", "64", "--k", "8", *cd, "--output", str(out / "e648.png")],
        "forced summary": [*INSPECT, *small, "--summary", "--output", str(out / "e63-summary.png")],
    }
    return out, run_all(cmds)


def _ok(res):
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return res.stdout


def test_inspect_text_one_row_per_level(inspected, cache_dir):
    _, res = inspected
    layout, _ = read_entry(cache_dir / "exactly-n64-k8")
    for name in ("text", "entry"):
        out = _ok(res[name])
        assert out.startswith("ExactlyK(n=64, k=8):")
        rows = table_rows(out)
        assert [int(r.split()[0]) for r in rows] == list(range(1, len(layout.levels()) + 1))
        assert "nodes: name:" not in out  # too large to list node by node


def test_compile_cnf_json_stays_clean(inspected):
    facts = json.loads(_ok(inspected[1]["cnf json"]))  # libsdd's "Read CNF" goes to stderr
    assert facts["model_count"] == "4" and not facts["model_count_checked"]
    assert facts["spec"]["type"] == "CnfFile"


def test_inspect_text_small_lists_nodes(inspected):
    out = _ok(inspected[1]["text small"])
    assert "not smooth" in out and "nodes: name:" in out
    assert re.search(r"^  or\d+: \(", out, re.M) and "¬x" in out and "⊤" in out


def test_inspect_dot(inspected):
    out = _ok(inspected[1]["dot"])
    assert out.startswith("digraph") and out.rstrip().endswith("}")
    assert 'label="⊕"' in out and 'label="⊗"' in out and '"x0"' in out and " -> " in out


def test_inspect_png_and_svg(inspected):
    out, res = inspected
    assert "whole circuit" in _ok(res["png"]) and "whole circuit" in _ok(res["svg"])
    png = (out / "e63.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1000
    svg = (out / "r624.svg").read_text()
    assert "<svg" in svg and len(svg) > 1000


def test_inspect_summary_picture(inspected):
    out, res = inspected
    for name, file in (("summary n64", "e648.png"), ("forced summary", "e63-summary.png")):
        assert "per-level summary" in _ok(res[name])
        assert (out / file).read_bytes().startswith(PNG_MAGIC)


def test_json_cache_hit_reports_the_load(tmp_path, capsys):
    args = ["--n", "16", "--k", "3", "--json", "--cache-dir", str(tmp_path)]
    assert compile_main(args) == 0
    cold = json.loads(capsys.readouterr().out)
    assert compile_main(args) == 0
    hit = json.loads(capsys.readouterr().out)
    assert not cold["cache_hit"] and cold["seconds"] == cold["compile_seconds"] and cold["load_seconds"] is None
    assert hit["cache_hit"] and hit["status"] == "cache hit"
    assert hit["seconds"] == hit["load_seconds"] and hit["compile_seconds"] is None
    assert hit["stored_compile_seconds"] == cold["compile_seconds"]
    assert hit["compiler"] == "direct" and hit["sdd_size"] is None


def test_cache_dir_moves_the_native_libraries_too(tmp_path):
    """In a fresh process: --cache-dir wins over PROBMOE_CACHE for the circuits and the native
    libraries alike (the compile reports where the libraries go, and builds none)."""
    env = {**ENV, "PROBMOE_CACHE": str(tmp_path / "elsewhere")}
    res = subprocess.run(
        [*COMPILE, "--n", "16", "--k", "3", "--json", "--cache-dir", str(tmp_path / "mine")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    facts = json.loads(_ok(res))
    if "built on first use" in facts["evaluator"]:  # not a wheel's prebuilt library
        assert str(tmp_path / "mine" / "native") in facts["evaluator"]
    assert not (tmp_path / "mine" / "native").exists()  # a compile builds no C library
    assert not (tmp_path / "elsewhere").exists()


def test_cache_dir_leaves_the_environment_as_it_was(tmp_path, capsys):
    before = os.environ.get("PROBMOE_CACHE")
    assert compile_main(["--n", "8", "--k", "3", "--cache-dir", str(tmp_path)]) == 0
    with pytest.raises(SystemExit):
        compile_main(["--n", "8", "--k", "9", "--cache-dir", str(tmp_path)])
    assert os.environ.get("PROBMOE_CACHE") == before


def test_compiler_flag(tmp_path, capsys):
    assert compile_main(["--n", "64", "--k", "8", "--compiler", "pysdd", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "(pysdd " in out and "SDD          size 1,639, 504 decision nodes (balanced vtree)" in out
    assert "752 elements" in out and str(tmp_path / "exactly-n64-k8-pysdd") in out
    with pytest.raises(SystemExit) as info:
        compile_main(["--n", "64", "--k", "8", "--compiler", "d4", "--cache-dir", str(tmp_path)])
    assert info.value.code == 2
    assert "--compiler must be one of 'direct', 'pysdd' for ExactlyK" in capsys.readouterr().err


def test_spec_flag_names_any_kind_by_its_json_form(tmp_path, capsys):
    """--spec takes the "spec" that --json prints: the same entry as the flags, a cache hit."""
    flags = ["--n", "16", "--kmin", "2", "--kmax", "5", "--groups", "4,4,8", "--capacity", "3"]
    assert compile_main([*flags, "--json", "--cache-dir", str(tmp_path)]) == 0
    first = json.loads(capsys.readouterr().out)
    form = {name: value for name, value in first["spec"].items() if name != "describe"}
    assert compile_main(["--spec", json.dumps(form), "--json", "--cache-dir", str(tmp_path)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["cache_hit"] and again["spec"] == first["spec"] and again["cache_path"] == first["cache_path"]
