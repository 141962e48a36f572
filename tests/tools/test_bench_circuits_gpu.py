"""tools/bench_circuits_gpu.py: the byte model (--estimate) in the default suite, the CPU rehearsal of the
whole benchmark in Triton's interpreter (--rehearse) among the slow tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (the optional extra: pip install -e '.[triton]')")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "bench_circuits_gpu.py"


def _run(args, tmp_path, timeout):
    env = {k: x for k, x in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def test_estimate(tmp_path):
    """The traffic model on the cardinality circuits (no CNF: --cnf names none that needs d4)."""
    text, rows = _run(["--estimate", "--sizes", "16:4,12:3-5", "--cnf", ""], tmp_path, 300)
    assert "estimate (not a measurement)" in text
    assert [r["circuit"] for r in rows] == ["16:4", "12:3-5"]
    for r in rows:
        assert r["jvp"] > r["sample"] > r["elements"] > 0 and r["gigabytes"] > 0


@pytest.mark.slow  # the interpreter: a few minutes
def test_rehearse(tmp_path):
    """Every part on the CPU at tiny sizes: routes over softmax + top-k, log Z + marginals (PyJuice skipped
    or failed on the CPU, said in one line), in Triton's interpreter."""
    text, rows = _run(["--rehearse", "--cnf", ""], tmp_path, 1800)
    parts = {r["part"] for r in rows}
    assert parts == {"route", "log_z"}, text
    assert "route circuit (triton)" in {r.get("routine") for r in rows}
    assert "PyJuice" in text
