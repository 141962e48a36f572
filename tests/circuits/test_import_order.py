"""The torch side of circuits (the kernels, the operators, the DP) imports in any order, and
``import circuits`` and the compile command load no torch: each in a fresh process."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository
FIRST = [
    "circuits.kernels.select",
    "circuits.kernels.rows",
    "circuits.kernels.uniforms",
    "circuits.kernels.c_dp",
    "circuits.kernels.torch_passes",
    "circuits.dp",
    "circuits.dp.cardinality",
    "circuits.ops",
]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


FIRST_CODE = "import {}, torch, circuits; circuits.engine; torch.ops.circuits.topk; torch.ops.circuits.dp_marginals"


@pytest.fixture(scope="module")
def first_imports() -> dict:
    """{module: (return code, stderr)} of one fresh process per module of FIRST, all started at once
    (each is mostly torch's import: run side by side they take about half the time)."""
    procs = {
        m: subprocess.Popen([sys.executable, "-c", FIRST_CODE.format(m)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for m in FIRST
    }
    done = {}
    for m, p in procs.items():
        _, err = p.communicate(timeout=300)
        done[m] = (p.returncode, err)
    return done


@pytest.mark.parametrize("module", FIRST)
def test_any_module_first(first_imports, module):
    """Imported first, each leaves the operators registered once an evaluator is used."""
    code, err = first_imports[module]
    assert code == 0, err[-2000:]


def test_compiling_loads_no_torch():
    code = (
        "import sys, circuits, circuits.inspect.cli, circuits.compiler.compile; from circuits import ExactlyK; "
        "print('torch' in sys.modules)"
    )
    assert _run(code) == "False"
