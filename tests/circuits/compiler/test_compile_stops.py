"""A compile the user can stop (issue 42, point 5.1): d4 on a hard CNF runs in a child process, so
Ctrl-C ends probmoe-compile within a second or two (status 130, one line, the child gone) and
``time_limit`` / ``--time-limit`` bound it; --force's help promises no size refusal to CNF files."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import circuits
from circuits.compiler import cnf
from circuits.inspect import cli

pytest.importorskip("py_d4")


@pytest.fixture(scope="module")
def hard(tmp_path_factory) -> Path:
    """A random 3-CNF of 2,000 variables at clause ratio 4.26 (8,520 clauses): d4 runs for minutes."""
    rng = random.Random(0)
    n, m = 2000, 8520
    lines = [
        " ".join(str(v if rng.random() < 0.5 else -v) for v in rng.sample(range(1, n + 1), 3)) + " 0" for _ in range(m)
    ]
    path = tmp_path_factory.mktemp("hard") / "hard.cnf"
    path.write_text(f"p cnf {n} {m}\n" + "\n".join(lines) + "\n")
    return path


def workers(parent: int) -> list[int]:
    """The d4 child processes of ``parent`` still alive (their command line holds the worker's code)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"py_d4" in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(int(pid))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_time_limit_stops_d4_and_leaves_no_child(hard, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(cnf.TimeLimit, match=r"did not finish within time_limit=1 s") as info:
        circuits.compile_circuit(hard, cache_dir=tmp_path, time_limit=1)
    assert time.monotonic() - t0 < 5 and info.value.seconds == 1
    assert workers(os.getpid()) == [] and not any(tmp_path.rglob("manifest.json"))


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_stops_probmoe_compile_on_a_hard_cnf_at_once(hard, tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from circuits.inspect.cli import compile_main; raise SystemExit(compile_main())",
            "--cnf",
            str(hard),
            "--cache-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not workers(proc.pid):  # d4 has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    time.sleep(1.0)  # well inside d4's native code
    child = workers(proc.pid)
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 2.0
    assert proc.returncode == 130 and out == ""
    assert err == f"probmoe-compile: interrupted (SIGINT) while compiling CnfFile({hard.name}); nothing was cached\n"
    assert child and not any(Path(f"/proc/{pid}").exists() for pid in child)  # killed and reaped
    assert not any(tmp_path.rglob("manifest.json"))


def test_time_limit_is_checked_in_one_line(tmp_path, hard, capsys):
    for argv, want in (
        [["--n", "8", "--k", "2", "--time-limit", "5"], "--time-limit applies to --cnf compiled by d4"],
        [["--cnf", str(hard), "--time-limit", "0"], "argument --time-limit: must be a number of seconds > 0, got '0'"],
        [["--cnf", str(hard), "--time-limit", "inf"], "must be a number of seconds > 0"],
    ):
        with pytest.raises(SystemExit) as info:
            cli.compile_main([*argv, "--cache-dir", str(tmp_path)])
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and want in err, err
    with pytest.raises(ValueError, match="time_limit applies to a CNF compiled by d4"):
        circuits.compile_circuit(circuits.ExactlyK(8, 2), cache_dir=tmp_path, time_limit=5)
    with pytest.raises(ValueError, match="time_limit must be a number of seconds > 0 or None"):
        circuits.compile_circuit(hard, cache_dir=tmp_path, time_limit=-1)


def test_force_help_promises_no_size_refusal_to_cnf_files():
    p = cli._parser("probmoe-compile", "")
    p.add_argument("--force", action="store_true", help=cli._FORCE_HELP)
    (force,) = [a.help for a in p._actions if "--force" in a.option_strings]
    assert "counting circuit (--n ...)" in force and "CNF and SDD files have no size limit" in force


def test_a_small_cnf_still_compiles_with_a_time_limit(tmp_path):
    sat = Path(__file__).parents[2] / "data" / "satlib" / "uf20-01.cnf"
    c = circuits.compile_circuit(sat, cache_dir=tmp_path, time_limit=60)
    assert c.layout.model_count() == 8 and c.info["compiler"] == "d4"
