"""CNF compilation benchmark: d4 against pysdd on DIMACS files, counts checked against Ganak.

    python tools/bench_cnf.py FOLDER_OR_FILES... [--pysdd-timeout 60] [--cardinality]
    python tools/bench_cnf.py FOLDER_OR_FILES... --stages [--baseline REV]
    python tools/bench_cnf.py --estimates

For each .cnf file (a folder is searched for *.cnf): ``compile_circuit`` with d4 on an empty cache
(compile time as ``circuit.info["compile_seconds"]``: d4, flattening, checks; the call's CPU time
and d4's own share beside it), the layout's size, the exact model count against Ganak's (``pyganak``), and log Z at
zero logits against log(#models) - n log 2; then pysdd's ``SddManager.from_cnf_file`` on a
balanced vtree in a child process killed after ``--pysdd-timeout`` seconds (its SDD size and
time, or "> T s"). ``--cardinality`` adds the cold compile of ExactlyK(1024, 128) and
ExactlyK(4096, 64) by the ``probmoe-compile`` command in fresh processes on an empty cache
(compile time, process wall and CPU time, cache entry size), beside the pysdd compiler on
ExactlyK(1024, 128) and a process that only imports the command (the start-up part of the wall
time). ``--stages`` times instead the Python part of the d4 path on one d4 output per file (d4
runs once: its output varies from run to run): reading the NNF text, flattening it into the
layout, the model count, the direct log Z and the layout's log Z at the probe logits (the
independent check), each the best of ``--repeats`` in a fresh process; with ``--baseline REV``
the same stages of the code at git revision REV (``git archive`` into a temporary folder) on the
same texts, each process right after this tree's, and the ratios. ``--estimates`` compares the
size estimate (``circuits.compiler.estimate``, what the size limit refuses on) with the direct compiler on
the counting specs of docs/reports/circuits-compile-epyc-2026-11.md: estimated and real live elements, estimated seconds and
the measured ``compile_seconds`` on an empty cache (median of 3). Prints markdown tables for
docs/reports/circuits-compile-epyc-2026-11.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from timing import table

import circuits
from circuits.compiler import cnf

PYSDD = """
import sys, time
from pysdd.sdd import SddManager
from circuits.compiler.cnf import quiet_stdout
t = time.perf_counter()
with quiet_stdout():
    mgr, root = SddManager.from_cnf_file(sys.argv[1].encode(), b"balanced")
print(time.perf_counter() - t, root.size(), root.count(), int(root.is_false()))
"""

STAGES = """
import json, sys, time
from circuits.compiler import nnf, self_check
text, n, repeats = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3])
r = self_check.probe_logits(n)
best = {}
for _ in range(repeats):
    t = [time.perf_counter()]
    parsed = nnf.parse(text, n)
    t.append(time.perf_counter())
    layout = nnf.to_layout(parsed)
    t.append(time.perf_counter())
    layout.model_count()
    t.append(time.perf_counter())
    want = nnf.log_partition(parsed, r)
    t.append(time.perf_counter())
    self_check.agree(self_check.layout_log_partition(layout, r), want)
    t.append(time.perf_counter())
    for name, a, b in zip(("parse", "flatten", "count", "nnf log Z", "layout log Z"), t, t[1:]):
        best[name] = min(best.get(name, 1e9), b - a)
best["total"] = sum(best.values())
print(json.dumps(best))
"""
STAGE_NAMES = ("parse", "flatten", "count", "nnf log Z", "layout log Z", "total")

COMMAND = (
    "import sys; from circuits.inspect.cli import compile_main; raise SystemExit(compile_main())"  # = probmoe-compile
)
IMPORT = "import time, circuits.inspect.cli; print(time.process_time())"


def cnf_files(paths: list[str]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.cnf")) if p.is_dir() else [p]
    if not out:
        raise SystemExit("bench_cnf.py: error: no .cnf files in " + " ".join(paths))
    return out


def ganak(n: int, clauses) -> tuple[int, float] | None:
    try:
        import pyganak
    except ImportError:
        return None
    counter = pyganak.Counter()
    counter.new_vars(n)
    counter.add_clauses(clauses)
    t = time.perf_counter()
    with cnf.quiet_stdout():  # Ganak prints "c o ..." lines from C
        count = int(counter.count())
    return count, time.perf_counter() - t


def pysdd_run(path: Path, timeout: float) -> tuple[str, str]:
    """pysdd's compile time and SDD size, in a child process killed after ``timeout`` seconds
    (0: not run)."""
    if timeout <= 0:
        return "not run", "-"
    try:
        res = subprocess.run(
            [sys.executable, "-c", PYSDD, str(path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=Path(__file__).parent.parent,
        )
    except subprocess.TimeoutExpired:
        return f"> {timeout:.0f} s", "-"
    if res.returncode != 0:
        return "failed", "-"
    seconds, size, count, false = res.stdout.split()
    return f"{float(seconds):.2f} s", "FALSE" if int(false) else f"{int(size):,}"


def d4_run(path: Path) -> dict:
    n, clauses = cnf.read_clauses(path)
    row = {"file": path.name, "n": n, "clauses": len(clauses), "cpu": None}
    with tempfile.TemporaryDirectory() as d:
        t, cpu = time.perf_counter(), time.process_time()
        try:
            c = circuits.compile_circuit(path, cache_dir=d)
        except ValueError as exc:
            if "unsatisfiable" not in str(exc):
                raise
            row.update(compile=time.perf_counter() - t, d4=None, nodes="unsat", elements="-", count=0)
        else:
            row["cpu"] = time.process_time() - cpu
            s = c.sizes()
            count = c.layout.model_count()
            logz = c.log_partition(torch.zeros(1, n, dtype=torch.float64))[0].item()
            assert abs(logz - (math.log(count) - n * math.log(2))) < 1e-9, (path, logz)
            row.update(
                compile=c.info["compile_seconds"],
                d4=c.info["d4_seconds"],
                nnf=c.info["nnf_nodes"],
                nodes=f"{s['nodes']:,}",
                elements=f"{s['elements']:,}",
                levels=s["levels"],
                count=count,
            )
    g = ganak(n, clauses)
    row["ganak"] = "-" if g is None else ("ok" if g[0] == row["count"] else f"MISMATCH {g[0]}")
    row["ganak_seconds"] = None if g is None else g[1]
    return row


def cardinality(repeats: int) -> list[tuple]:
    """``probmoe-compile --n N --k K --json`` in fresh processes on an empty cache, after the
    baseline: a process that only imports the command."""
    rows = []
    root = Path(__file__).parent.parent
    for _ in range(repeats):
        t = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", IMPORT], check=True, capture_output=True, text=True, cwd=root)
        rows.append(
            (
                "(baseline: import the command)",
                "-",
                "-",
                f"{time.perf_counter() - t:.2f}",
                f"{float(res.stdout):.2f}",
                "-",
            )
        )
    for n, k, compiler in ((1024, 128, "direct"), (4096, 64, "direct"), (1024, 128, "pysdd")):
        for _ in range(1 if compiler == "pysdd" else repeats):
            with tempfile.TemporaryDirectory() as d:
                cmd = [
                    sys.executable,
                    "-c",
                    COMMAND,
                    "--n",
                    str(n),
                    "--k",
                    str(k),
                    "--compiler",
                    compiler,
                    "--cache-dir",
                    d,
                    "--force",
                    "--json",
                ]
                before = os.times()
                t = time.perf_counter()
                res = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=900)
                wall, after = time.perf_counter() - t, os.times()
                if res.returncode:
                    raise SystemExit(res.stderr)
                facts = json.loads(res.stdout)
                entry = Path(facts["cache_path"])
                size = sum(f.stat().st_size for f in entry.iterdir())
                cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
                rows.append(
                    (
                        f"ExactlyK({n}, {k})",
                        compiler,
                        f"{facts['compile_seconds']:.2f}",
                        f"{wall:.2f}",
                        f"{cpu:.2f}",
                        f"{size / 2**20:.1f}",
                    )
                )
    return rows


def stages_in(tree: Path, nnf_path: Path, n: int, repeats: int) -> dict:
    """The best times of each stage (``STAGES``) on one NNF text, by the code in ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run(
        [sys.executable, "-c", STAGES, str(nnf_path), str(n), str(repeats)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(res.stdout)


def stages(files: list[Path], repeats: int, baseline: str | None) -> str:
    """The stage table (see the module docstring)."""
    root = Path(__file__).resolve().parent.parent
    rows = []
    with tempfile.TemporaryDirectory() as d:
        old = None
        if baseline is not None:
            old = Path(d) / "baseline"
            old.mkdir()
            archive = subprocess.run(["git", "archive", baseline], cwd=root, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        for path in files:
            d4 = cnf.compile_d4(path)
            if d4.count == 0:
                continue
            text = Path(d) / "circuit.nnf"
            text.write_text(d4.nnf)
            new_t = stages_in(root, text, d4.n, repeats)
            old_t = None if old is None else stages_in(old, text, d4.n, repeats)
            for name in STAGE_NAMES:
                cells = [f"{new_t[name] * 1e3:.1f}"]
                if old_t is not None:
                    cells = [f"{old_t[name] * 1e3:.1f}", *cells, f"{old_t[name] / new_t[name]:.1f}x"]
                rows.append(
                    (path.name if name == "parse" else "", f"{d4.nodes:,}" if name == "parse" else "", name, *cells)
                )
    header = ("file", "d4 nodes", "stage")
    header += (f"{baseline} ms", "this tree ms", "speed-up") if baseline is not None else ("ms",)
    return table(rows, header)


ESTIMATED = (
    circuits.ExactlyK(64, 8),
    circuits.ExactlyK(1024, 128),
    circuits.ExactlyK(4096, 64),
    circuits.ExactlyK(16384, 16),
    circuits.ExactlyK(100000, 2),
    circuits.RangeK(512, 100, 400),
    circuits.RangeK(1024, 0, 128),
    circuits.GroupLimited(256, 64, 8, 4),
    circuits.GroupCapacity(1024, 128, 64, 4),
    circuits.GroupCapacity(2048, 64, 256, 1),
    circuits.GroupCapacity(48, groups=[8, 16, 4, 20], capacity=3, kmin=2, kmax=9),
)


def estimates() -> str:
    """The estimate against the direct compiler (see the module docstring)."""
    from circuits.compiler.estimate import estimate

    rows = []
    for spec in ESTIMATED:
        est = estimate(spec)
        times, real = [], None
        for _ in range(3):
            with tempfile.TemporaryDirectory() as d:
                c = circuits.compile_circuit(spec, cache_dir=d)
                times.append(c.info["compile_seconds"])
                real = c.sizes()["elements"]
        measured = sorted(times)[1]
        rows.append(
            (
                spec.describe(),
                f"{'' if est.exact else '≤ '}{est.elements:,}",
                f"{real:,}",
                f"{est.steps / 1e6:.2f}M",
                f"{est.seconds:.2f}",
                f"{measured:.2f}",
                f"{est.seconds / measured:.1f}",
            )
        )
    return table(
        rows,
        ("spec", "estimated elements", "real elements", "steps", "estimated s", "measured s", "estimated / measured"),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="DIMACS files or folders of *.cnf")
    ap.add_argument(
        "--pysdd-timeout",
        type=float,
        default=60.0,
        help="seconds before pysdd is stopped (default 60; 0: do not run pysdd)",
    )
    ap.add_argument("--cardinality", action="store_true", help="also time ExactlyK(1024, 128) and (4096, 64)")
    ap.add_argument(
        "--repeats", type=int, default=3, help="fresh processes per cardinality row, or repeats per stage (default 3)"
    )
    ap.add_argument("--estimates", action="store_true", help="the size estimate against the direct compiler")
    ap.add_argument("--stages", action="store_true", help="time the Python stages of the d4 path instead")
    ap.add_argument("--baseline", metavar="REV", help="with --stages: also time the code at git revision REV")
    args = ap.parse_args()
    if args.estimates:
        print(estimates())
        return
    if not args.paths and not args.cardinality:
        ap.error("give DIMACS files or folders, or --cardinality")
    if args.baseline is not None and not args.stages:
        ap.error("--baseline goes with --stages")
    files = cnf_files(args.paths) if args.paths else []
    if args.stages:
        print(stages(files, args.repeats, args.baseline))
        return
    rows = []
    for i, path in enumerate(files, start=1):
        print(f"[{i}/{len(files)}] {path.name}", file=sys.stderr, flush=True)
        r = d4_run(path)
        pysdd_time, pysdd_size = pysdd_run(path, args.pysdd_timeout)
        rows.append(
            (
                r["file"],
                r["n"],
                r["clauses"],
                f"{r['compile']:.2f} s",
                "-" if r["cpu"] is None else f"{r['cpu']:.2f} s",
                "-" if r["d4"] is None else f"{r['d4']:.2f} s",
                r["nodes"],
                r["elements"],
                f"{r['count']:,}",
                r["ganak"],
                "-" if r["ganak_seconds"] is None else f"{r['ganak_seconds']:.2f} s",
                pysdd_time,
                pysdd_size,
            )
        )
    if rows:
        print(
            table(
                rows,
                (
                    "file",
                    "vars",
                    "clauses",
                    "d4 compile",
                    "its CPU",
                    "of it d4",
                    "layout nodes",
                    "elements",
                    "models",
                    "= Ganak",
                    "Ganak time",
                    "pysdd compile",
                    "SDD size",
                ),
            )
        )
    if args.cardinality:
        print()
        print(
            table(
                cardinality(args.repeats),
                ("spec", "compiler", "compile s", "process wall s", "process CPU s", "entry MB"),
            )
        )


if __name__ == "__main__":
    main()
