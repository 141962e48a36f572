"""The Triton passes (circuits/kernels/triton_passes.py): selection, the checks against the torch
passes and brute force (tests/circuits/circuits_triton_checks.py, in a child process), compilation for GPUs.

Without CUDA the checks run in Triton's interpreter, on CPU tensors: TRITON_INTERPRET=1 must be set
before triton defines any kernel, its own library's included, so the child process has it from the
start and this process never does. Triton is an optional extra (pip install -e ".[triton]"):
without it this module is skipped.
"""

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import circuits
from circuits.kernels.select import CPasses, TorchPasses

pytest.importorskip("triton", reason="triton is not installed (the optional extra: pip install -e '.[triton]')")

from circuits.kernels.triton_passes import TritonPasses

HERE = Path(__file__).parent


def _child_env(interpret: bool) -> dict:
    env = {k: x for k, x in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "TRITON_INTERPRET": "1"} if interpret else env


@pytest.mark.slow  # a nested pytest under the Triton interpreter: about 40 s alone, the longest default test
def test_against_the_torch_passes_and_brute_force():
    """tests/circuits/circuits_triton_checks.py in a child process: interpreted on the CPU, compiled with CUDA.
    Everything runs but, on the CPU, the check of host synchronisations (CUDA only)."""
    cuda = torch.cuda.is_available()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rfEs",
            str(HERE / "circuits_triton_checks.py"),
        ],
        cwd=HERE.parent.parent,
        env=_child_env(not cuda),
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, summary
    skipped = re.search(r"(\d+) skipped", done.stdout)
    assert re.search(r"\d+ passed", done.stdout), summary
    assert int(skipped.group(1) if skipped else 0) == (0 if cuda else 1), summary


def test_select():
    c = circuits.compile_circuit(circuits.ExactlyK(6, 3))
    assert isinstance(circuits.passes.select(c.program, torch.float32, prefer="triton"), TritonPasses)
    assert isinstance(circuits.passes.select(c.program, torch.float32, prefer="torch"), TorchPasses)
    with pytest.raises(ValueError, match="float32"):
        circuits.passes.select(c.program, torch.float64, prefer="triton")
    with pytest.raises(ValueError, match="prefer"):
        circuits.passes.select(c.program, torch.float32, prefer="cuda")
    with pytest.raises(ValueError, match="power of two"):
        TritonPasses(c.program, block=48)
    if torch.cuda.is_available():
        g = circuits.compile_circuit(circuits.ExactlyK(6, 3), device="cuda").program
        assert isinstance(circuits.passes.select(g, torch.float32), TritonPasses)
        assert isinstance(circuits.passes.select(g, torch.float64), TorchPasses)
        with pytest.raises(ValueError, match="CPU"):
            circuits.passes.select(g, torch.float32, prefer="c")
    else:
        assert type(circuits.passes.select(c.program, torch.float32)) in (CPasses, TorchPasses)


COMPILE_FOR_GPUS = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from circuits.kernels import triton_kernels as K

INT = {"T", "n", "S", "R", "D"}
TABLES = {"nodes", "prime", "sub", "imp_off", "imp_var"}
for arch in (80, 90):
    for fn in (K.marginals_kernel, K.sample_kernel, K.map_kernel, K.jvp_kernel):
        for smooth in (False, True):
            consts = {"B": 64, "SMOOTH": smooth, "MARGINALS": True}
            consts = {k: x for k, x in consts.items() if k in fn.arg_names}
            sig = {a: "constexpr" if a in consts else "i32" if a in INT else "*i32" if a in TABLES else "*fp32"
                   for a in fn.arg_names}
            src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): x for k, x in consts.items()})
            triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 2, "enable_fp_fusion": False})
print("compiled")
"""


def test_the_kernels_compile_for_gpus():
    """The interpreter accepts code the compiler rejects: compile every kernel to sm_80 and sm_90 cubins
    (no GPU needed; ptxas comes with triton), in a child process without TRITON_INTERPRET."""
    from triton.compiler import ASTSource

    if "constexprs" not in inspect.signature(ASTSource).parameters:
        pytest.skip("this triton's ASTSource takes another signature")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_GPUS],
        cwd=HERE.parent.parent,
        env=_child_env(False),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
