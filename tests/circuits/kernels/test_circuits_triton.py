"""The Triton passes (circuits/kernels/triton_passes.py): selection, the checks against the torch
passes and brute force (tests/circuits/kernels/circuits_triton_checks.py, in a child process), compilation for GPUs.

Without CUDA the checks run in Triton's interpreter, on CPU tensors: TRITON_INTERPRET=1 must be set
before triton defines any kernel, its own library's included, so the child process has it from the
start and this process never does. Triton is an optional extra (pip install -e ".[triton]"):
without it this module is skipped.
"""

import inspect
import re
from pathlib import Path

import pytest
import torch
from triton_child import run_checks, run_compiled

import circuits
import circuits.kernels.select
from circuits.kernels.c_passes import CPasses
from circuits.kernels.torch_passes import TorchPasses

pytest.importorskip("triton", reason="triton is not installed (the optional extra: pip install -e '.[triton]')")

from circuits.kernels.triton_passes import TritonPasses

HERE = Path(__file__).parent


@pytest.mark.slow  # a nested pytest under the Triton interpreter: 5-10 min on 2 busy cores (it pays per program and op)
def test_against_the_torch_passes_and_brute_force():
    """tests/circuits/kernels/circuits_triton_checks.py in a child process: interpreted on the CPU, compiled with CUDA.
    Everything runs but, on the CPU, the check of host synchronisations (CUDA only), and without d4 the CNF
    circuit it compiles."""
    cuda = torch.cuda.is_available()
    done = run_checks(str(HERE / "circuits_triton_checks.py"), timeout=2400)
    summary = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, summary
    skipped = re.search(r"(\d+) skipped", done.stdout)
    assert re.search(r"\d+ passed", done.stdout), summary
    import importlib.util

    no_d4 = importlib.util.find_spec("py_d4") is None  # the cnf extra: the d4-compiled CNF check skips without it
    assert int(skipped.group(1) if skipped else 0) == (0 if cuda else 1) + no_d4, summary


def test_select():
    c = circuits.compile_circuit(circuits.ExactlyK(6, 3))
    assert isinstance(circuits.kernels.select.select(c.program, torch.float32, prefer="triton"), TritonPasses)
    assert isinstance(circuits.kernels.select.select(c.program, torch.float32, prefer="torch"), TorchPasses)
    with pytest.raises(ValueError, match="float32"):
        circuits.kernels.select.select(c.program, torch.float64, prefer="triton")
    with pytest.raises(ValueError, match="prefer"):
        circuits.kernels.select.select(c.program, torch.float32, prefer="cuda")
    with pytest.raises(ValueError, match="power of two"):
        TritonPasses(c.program, block=48)
    if torch.cuda.is_available():
        g = circuits.compile_circuit(circuits.ExactlyK(6, 3), device="cuda").program
        assert isinstance(circuits.kernels.select.select(g, torch.float32), TritonPasses)
        assert isinstance(circuits.kernels.select.select(g, torch.float64), TorchPasses)
        with pytest.raises(ValueError, match="CPU"):
            circuits.kernels.select.select(g, torch.float32, prefer="c")
    else:
        assert type(circuits.kernels.select.select(c.program, torch.float32)) in (CPasses, TorchPasses)


COMPILE_FOR_GPUS = """
from circuits.kernels.triton_layers_compile import compile_all
for arch in (80, 90):
    for row in compile_all(arch):
        assert row["registers"] <= 255, (arch, row)
        # sm_90 (H100, the device): no spills; sm_80's ptxas keeps the plain upward pass at 80 registers
        # with a 12-byte spill, which it is allowed
        assert row["spill_stores"] <= (0 if arch == 90 else 64), (arch, row)
print("compiled")
"""


@pytest.mark.slow  # 38 cubins: about 2 minutes on 2 cores (tests/circuits/kernels/test_triton_layers.py compiles one by default)
def test_the_kernels_compile_for_gpus():
    """The interpreter accepts code the compiler rejects: compile every kernel specialisation the passes
    launch (circuits/kernels/triton_layers_compile.py) to sm_80 and sm_90 cubins (no GPU needed; ptxas comes
    with triton), in a child process without TRITON_INTERPRET, and check ptxas reports no spills for sm_90."""
    from triton.compiler import ASTSource

    if "constexprs" not in inspect.signature(ASTSource).parameters:
        pytest.skip("this triton's ASTSource takes another signature")
    done = run_compiled(COMPILE_FOR_GPUS, timeout=900)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
