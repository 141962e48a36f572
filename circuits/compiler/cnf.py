"""DIMACS CNF files compiled by the d-DNNF compiler d4 (the ``d4solver`` package, module ``py_d4``).

d4 is an optional extra (``pip install 'probmoe[cnf]'``): the core of probmoe builds its counting
circuits itself (``circuits.compiler.count_tree``) and needs no CNF compiler; d4 is a compiled wheel for
fewer platforms than torch. Without it ``compile_circuit`` on a CNF raises ``MissingExtra`` naming
the extra (``compiler="pysdd"`` still compiles small CNFs with pysdd).

d4 and libsdd print statistics on file descriptor 1 from C, pysdd its "Read CNF" line on
``sys.stdout``; ``quiet_stdout`` sends both to /dev/null meanwhile, so none reaches the user's
stdout.

d4 runs in a child process (``compile_d4``): in this one its native code would hold the main
thread, so that neither Ctrl-C nor a time limit could stop a hard CNF (a random 3-CNF of 2,000
variables at clause ratio 4.26 runs for more than ten minutes). The child reads the clauses from a
file, writes d4's NNF text, count and size to another, and is killed (SIGKILL) when this process
gets a KeyboardInterrupt (or any other exception) while it waits, when ``time_limit`` passes, or
(on Linux) when this process dies. Starting it costs about 0.2 s.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from . import file_checks

EXTRA = "cnf"
_FD_LOCK = threading.Lock()


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


class TimeLimit(RuntimeError):
    """A compile ran past its time limit and was stopped; ``seconds`` is the limit."""

    def __init__(self, what: str, seconds: float):
        super().__init__(f"{what} did not finish within time_limit={seconds:g} s and was stopped")
        self.what, self.seconds = what, seconds


# The child process: the clauses from argv[1], the result to argv[2] (written whole, then renamed),
# d4's statistics on fd 1 to /dev/null. Run with -c from a temporary folder, so that nothing beside
# it shadows a module.
_WORKER = """
import ctypes, json, os, signal, sys, time
try:  # SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG = 1), then check it has not yet
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[3]):
    sys.exit("the process that started d4 has ended")
import py_d4
with open(sys.argv[1]) as f:
    n, clauses = json.load(f)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
t0 = time.perf_counter()
result = py_d4.Solver(clauses, n).compile()
out = {"nnf": result.getNNFString(), "count": str(int(result.count([]))), "nodes": int(result.getNbNodes()),
       "seconds": time.perf_counter() - t0}
with open(sys.argv[2] + ".tmp", "w") as f:
    json.dump(out, f)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
"""


@contextlib.contextmanager
def quiet_stdout():
    """File descriptor 1 goes to /dev/null while the block runs (C code's printf / std::cout
    included), and so does ``sys.stdout`` (pysdd prints "Read CNF: ..." from Cython); C's stdio
    buffers are flushed before the descriptor is restored."""
    with _FD_LOCK:
        sys.stdout.flush()
        saved = os.dup(1)
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            ctypes.CDLL(None).fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)


def read_clauses(path) -> tuple[int, list[list[int]]]:
    """(variables, clauses) of a DIMACS file, after ``file_checks.check_dimacs``."""
    file_checks.check_dimacs(path)
    n, clauses, cur = 0, [], []
    for line in Path(path).read_text().splitlines():
        words = line.split()
        if not words or words[0] == "c":
            continue
        if words[0] == "%":
            break
        if words[0] == "p":
            n = int(words[2])
            continue
        for lit in map(int, words):
            if lit == 0:
                clauses.append(cur)
                cur = []
            else:
                cur.append(lit)
    return n, clauses


@dataclass(frozen=True)
class D4Result:
    """What d4 made of a CNF: ``nnf`` its d-DNNF as NNF text (``circuits.compiler.nnf``), ``count`` its
    exact model count over all ``n`` variables, ``nodes`` d4's node count, ``seconds`` d4's time."""

    n: int
    nnf: str
    count: int
    nodes: int
    seconds: float


def d4_version() -> str:
    try:
        return importlib.metadata.version("d4solver")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def compile_d4(path, time_limit: float | None = None) -> D4Result:
    """Compile the DIMACS file at ``path`` with d4 in a child process (its output silenced);
    MissingExtra without d4. The child is killed on a KeyboardInterrupt while it runs, and after
    ``time_limit`` seconds (None: no limit) with ``TimeLimit``; RuntimeError if it fails."""
    try:
        import py_d4
    except ImportError:
        raise MissingExtra(
            f"compiling a CNF needs the d-DNNF compiler d4 (package d4solver): pip install 'probmoe[{EXTRA}]'; "
            "or pass compiler='pysdd' (probmoe-compile --compiler pysdd) to compile it with pysdd, which "
            "manages only small CNFs"
        ) from None
    del py_d4  # the child imports it; here it was only the check that it is installed
    if time_limit is not None and not (
        isinstance(time_limit, (int, float)) and not isinstance(time_limit, bool) and 0 < time_limit < float("inf")
    ):
        raise ValueError(f"time_limit must be a number of seconds > 0 or None, got {time_limit!r}")
    n, clauses = read_clauses(path)
    with tempfile.TemporaryDirectory(prefix="probmoe-d4-") as work:
        given, result = os.path.join(work, "clauses.json"), os.path.join(work, "result.json")
        with open(given, "w") as f:
            json.dump([n, clauses], f)
        with open(os.path.join(work, "stderr"), "w+") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, given, result, str(os.getpid())],
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            try:
                proc.wait(timeout=time_limit)
            except subprocess.TimeoutExpired:
                raise TimeLimit(f"d4 compiling {path}", time_limit) from None
            finally:  # a KeyboardInterrupt (Ctrl-C), a time limit, any error here: the child goes too
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            err.seek(0)
            why = err.read().strip().splitlines()
        if proc.returncode != 0 or not os.path.exists(result):
            how = f"status {proc.returncode}" if proc.returncode >= 0 else f"signal {-proc.returncode}"
            raise RuntimeError(f"d4 failed on {path} ({how}){': ' + why[-1] if why else ''}")
        with open(result) as f:
            out = json.load(f)
    return D4Result(n, out["nnf"], int(out["count"]), int(out["nodes"]), float(out["seconds"]))
