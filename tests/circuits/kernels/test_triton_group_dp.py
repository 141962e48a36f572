"""The group DP's Triton kernels (circuits/kernels/triton_group_dp.py): selection, the checks against
the torch group sweeps, brute force and float64 (tests/circuits/kernels/triton_group_checks.py, in a
child process: interpreted without CUDA), and compilation for sm_90 with registers and spills.
Triton is an optional extra: without it this module is skipped."""

import json
import re

import pytest
import torch
from triton_child import run_checks, run_compiled

import circuits
from circuits import GroupLimited
from circuits.kernels.lattice import GroupLattice
from circuits.kernels.select import select
from circuits.kernels.torch_groups import TorchGroupDP

pytest.importorskip("triton", reason="triton is not installed (the optional extra: pip install -e '.[triton]')")

from circuits.kernels.triton_group_dp import TritonGroupDP

CHECKS = "tests/circuits/kernels/triton_group_checks.py"


def test_select():
    """float32 group lattices on CUDA take the kernels; prefer="triton" anywhere (the interpreter's
    way in); "c" names what the group DP has."""
    cpu = GroupLattice(GroupLimited(8, 2, 4, 2), torch.device("cpu"))
    assert isinstance(select(cpu, torch.float32, prefer="triton"), TritonGroupDP)
    assert type(select(cpu, torch.float32)) is TorchGroupDP
    with pytest.raises(ValueError, match="float32"):
        select(cpu, torch.float64, prefer="triton")
    with pytest.raises(ValueError, match="no C sweeps"):
        select(cpu, torch.float32, prefer="c")
    if torch.cuda.is_available():
        cuda = GroupLattice(GroupLimited(8, 2, 4, 2), torch.device("cuda"))
        assert isinstance(select(cuda, torch.float32), TritonGroupDP)
        assert type(select(cuda, torch.float64)) is TorchGroupDP
        assert circuits.native_kernels(circuits.GroupDP(GroupLimited(8, 2, 4, 2), "cuda"), torch.float32)


def _passed(done) -> None:
    summary = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0 and re.search(r"\d+ passed", done.stdout), summary


def test_against_brute_force_and_the_torch_sweeps_in_the_interpreter():
    """The quick part of triton_group_checks.py in a child process (about 45 s): brute force (marginals,
    Cov(z), log Z) on one spec of each kind, chi^2 of the draws, the torch sweeps (values, draws,
    Cov(z) v), the fused route against the composed one, chunks of tokens."""
    _passed(run_checks(CHECKS, "-m", "not slow", timeout=1500))


@pytest.mark.slow  # several minutes in the interpreter
def test_every_spec_at_64_and_256_experts_and_through_the_operators():
    """The rest: brute force on every small spec, the torch sweeps and the fused route on the other
    specs (8 of 64 in 4 of 8 groups among them), the accuracy grid with forced groups at 64 and 256
    (DeepSeek-V3's gate), GroupDP and probmoe.route on the kernels, scratch filled with NaN first."""
    _passed(run_checks(CHECKS, "-m", "slow", timeout=3000))


COMPILE = """
import json
from circuits.kernels import triton_groups as K
from circuits.kernels.triton_lattice import compiled_resources
n, k, groups, top, kinds = SIZES
sizes = (n // groups,) * groups
out = []
for kind, kw in (("forward", dict(slots=k)), ("cov", dict(slots=k, v_from="softmax")), ("map", {})):
    if kind in kinds:
        plan = K.GroupPlan(kind, sizes, k, k, k, top, ck=K.segment(sizes, k, k, kind == "cov"), **kw)
        fn = K.kernel(plan)
        out.append(dict(kind=kind, ck=plan.ck, **compiled_resources(fn, K.TYPES, K.INTS, K.BLOCK, 90, {"num_stages": K.STAGES})))
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "sizes",
    [
        (16, 4, 4, 2, ("forward", "cov", "map")),
        pytest.param((256, 8, 8, 4, ("forward", "cov", "map")), marks=pytest.mark.slow),
    ],
    ids=lambda s: "{}:{}/{}g{}".format(*s),
)
def test_the_kernels_compile_for_sm90_without_spills(sizes):
    """The interpreter accepts code the compiler rejects: compile the routing kernels (forward with
    slots, Cov(z) v with Eq. 7's backward, the MAP) to sm_90 cubins (no GPU needed; ptxas comes with triton),
    in a child without TRITON_INTERPRET, and read registers and local memory from the cubin. Each
    compiles in seconds (the outer states in runtime loops: docs/gpu-lattice.md, "Groups: their
    kernels"); the 256-expert ones are in the slow set."""
    from triton.compiler import ASTSource

    if "constexprs" not in __import__("inspect").signature(ASTSource).parameters:
        pytest.skip("this triton's ASTSource takes another signature")
    done = run_compiled(COMPILE.replace("SIZES", repr(sizes)), timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    for kernel in json.loads(done.stdout.strip().splitlines()[-1]):
        print(kernel)
        assert kernel["spill_bytes"] == 0 and kernel["registers"] <= 255, kernel
