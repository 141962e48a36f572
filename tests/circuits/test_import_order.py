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


@pytest.mark.parametrize("module", FIRST)
def test_any_module_first(module):
    """Imported first, each leaves the operators registered once an evaluator is used."""
    _run(f"import {module}, torch, circuits; circuits.engine; torch.ops.circuits.topk; torch.ops.circuits.dp_marginals")


def test_compiling_loads_no_torch():
    code = (
        "import sys, circuits, circuits.inspect.cli, circuits.compiler.compile; from circuits import ExactlyK; "
        "print('torch' in sys.modules)"
    )
    assert _run(code) == "False"
