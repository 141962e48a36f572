"""The Triton lattice kernels of the cardinality DP (circuits/kernels/triton_dp.py): selection, the
checks against the torch DP, the C DP, brute force and float64 (tests/circuits/kernels/triton_dp_checks.py,
in a child process: interpreted without CUDA), and compilation for sm_90 with registers and spills.
Triton is an optional extra: without it this module is skipped."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from triton_child import child_env, run_checks

import circuits
from circuits.kernels.lattice import Lattice
from circuits.kernels.select import select

pytest.importorskip("triton", reason="triton is not installed (the optional extra: pip install -e '.[triton]')")

from circuits.kernels.triton_dp import TritonDP

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


def test_select():
    """float32 lattices on CUDA take the kernels; prefer="triton" anywhere (the interpreter's way in)."""
    cpu = Lattice(8, 2, 4, torch.device("cpu"))
    assert isinstance(select(cpu, torch.float32, prefer="triton"), TritonDP)
    with pytest.raises(ValueError, match="float32"):
        select(cpu, torch.float64, prefer="triton")
    assert not isinstance(select(cpu, torch.float32), TritonDP)
    if torch.cuda.is_available():
        assert isinstance(select(Lattice(8, 2, 4, torch.device("cuda")), torch.float32), TritonDP)
        assert circuits.native_kernels(circuits.CardinalityDP(circuits.ExactlyK(8, 2), "cuda"), torch.float32)


def _passed(done: subprocess.CompletedProcess) -> None:
    summary = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0 and re.search(r"\d+ passed", done.stdout), summary


def test_against_brute_force_in_the_interpreter():
    """The quick part of tests/circuits/kernels/triton_dp_checks.py in a child process (about 20 s alone):
    brute force (marginals, Cov(z), log Z), a chi^2 test of the draws, the torch DP at 3 of 8,
    chunks of tokens, the probability form in plain torch."""
    quick = "brute_force or draws_follow or 3..3 or chunks or probability_form"
    _passed(run_checks(str(HERE / "triton_dp_checks.py"), "-k", quick, timeout=1500))


@pytest.mark.slow  # about 2 minutes in the interpreter
def test_against_the_torch_dp_the_c_dp_and_float64():
    """tests/circuits/kernels/triton_dp_checks.py's default set in a child process: the torch DP (values,
    draws, Cov(z) v, log counts), the fused route against the composed one, the C DP's draws, the
    accuracy grid at 8 of 64, the operators and probmoe.route on the kernels."""
    _passed(run_checks(str(HERE / "triton_dp_checks.py"), timeout=1500))


@pytest.mark.slow
def test_at_256_experts_and_the_other_sizes():
    """The slow checks: the accuracy grid at n = 256 (exactly 16, and 8..32), range 4..8 of 64,
    sigmoid scores, every query with its scratch filled with NaN first."""
    _passed(run_checks(str(HERE / "triton_dp_checks.py"), "-m", "slow", timeout=1500))


COMPILE = """
import json, sys
from circuits.kernels import triton_lattice as L
kmin, kmax, slots = map(int, sys.argv[1:4])
out = []
for plan in (L.Plan("forward", kmin, kmax, slots=slots, ck=L.segment("forward", kmax)),
             L.Plan("cov", kmin, kmax, slots=slots, v_from="softmax", ck=L.segment("cov", kmax))):
    out.append(dict(kind=plan.kind, ck=plan.ck, **L.resources(plan, arch=90)))
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "sizes",
    [(8, 8, 8), pytest.param((16, 16, 16), marks=pytest.mark.slow)],
    ids=lambda s: f"{s[0]}..{s[1]}",
)
def test_the_kernels_compile_for_sm90_without_spills(sizes):
    """The interpreter accepts code the compiler rejects: compile the routing kernels (forward with
    slots, Cov(z) v with Eq. 7's backward) to sm_90 cubins (no GPU needed; ptxas comes with triton),
    in a child without TRITON_INTERPRET, and read registers and local memory from the cubin."""
    from triton.compiler import ASTSource

    if "constexprs" not in __import__("inspect").signature(ASTSource).parameters:
        pytest.skip("this triton's ASTSource takes another signature")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, *map(str, sizes)],
        cwd=ROOT,
        env=child_env(False),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for kernel in json.loads(done.stdout.strip().splitlines()[-1]):
        print(kernel)
        assert kernel["spill_bytes"] == 0 and kernel["registers"] <= 255, kernel
