"""DIMACS CNF files compiled by the d-DNNF compiler d4 (the ``d4solver`` package, module ``py_d4``).

d4 is an optional extra (``pip install 'probmoe[cnf]'``): the core of probmoe builds its counting
circuits itself (``circuits.count_tree``) and needs no CNF compiler; d4 is a compiled wheel for
fewer platforms than torch. Without it ``compile_circuit`` on a CNF raises ``MissingExtra`` naming
the extra (``compiler="pysdd"`` still compiles small CNFs with pysdd).

d4 and libsdd print statistics on file descriptor 1 from C, pysdd its "Read CNF" line on
``sys.stdout``; ``quiet_stdout`` sends both to /dev/null meanwhile, so none reaches the user's
stdout.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import io
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import file_checks

EXTRA = "cnf"
_FD_LOCK = threading.Lock()


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


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
    """What d4 made of a CNF: ``nnf`` its d-DNNF as NNF text (``circuits.nnf``), ``count`` its
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


def compile_d4(path) -> D4Result:
    """Compile the DIMACS file at ``path`` with d4 (its output silenced); MissingExtra without d4."""
    try:
        import py_d4
    except ImportError:
        raise MissingExtra(
            f"compiling a CNF needs the d-DNNF compiler d4 (package d4solver): pip install 'probmoe[{EXTRA}]'; "
            "or pass compiler='pysdd' (probmoe-compile --compiler pysdd) to compile it with pysdd, which "
            "manages only small CNFs") from None
    n, clauses = read_clauses(path)
    t0 = time.perf_counter()
    with quiet_stdout():
        result = py_d4.Solver(clauses, n).compile()
        text, count, nodes = result.getNNFString(), int(result.count([])), int(result.getNbNodes())
    return D4Result(n, text, count, nodes, time.perf_counter() - t0)
