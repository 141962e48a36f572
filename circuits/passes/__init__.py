"""The circuit passes: one computation, several implementations, and ``select``, the one place that
picks an implementation, for the circuit passes and for the cardinality DP (``circuits.dp``).

    program.py       Program: a level layout as device tensors; draw_uniforms (shared by all)
    interface.py     Passes: log Z + marginals, sample, MAP, Cov(z) v, the k-th largest logit
    torch_passes.py  TorchPasses: plain tensor operations, any device and dtype (the meaning;
                     the oracle of the others)
    c_passes.py      CPasses: fused C for fp32 on the CPU (sources in c/, built by c_library.py)
    triton_passes.py TritonPasses: fused Triton kernels (triton_kernels.py) for fp32 on CUDA; imported
                     only when chosen (it imports triton, an optional extra)
    by_node.py       the definition, node by node in Python: the oracle of TorchPasses (tests)
    scratch.py       ScratchPool: reused [rows, T] buffers

The row operations the passes share with ``probmoe`` (top-k, the k-th largest, counter-based
uniforms) and the C build machinery live in ``circuits.native``; ``circuits.ops`` registers the
passes as torch operators.

``select(program, dtype)`` is the only place that decides which implementation runs: of the
circuit passes for a circuit's ``Program``, of the DP's sweeps for a ``circuits.dp.Lattice`` (the
algorithm is the engine's: ``circuits.engine``); ``native_kernels(evaluator, dtype, device)`` says
whether it gives an evaluator the fused C ones.
"""

from __future__ import annotations

import functools

import torch

from ..native import rows
from . import c_library
from .c_passes import CPasses
from .interface import Passes
from .program import Program, draw_uniforms
from .torch_passes import TorchPasses

__all__ = [
    "IMPLEMENTATIONS",
    "CPasses",
    "Passes",
    "Program",
    "TorchPasses",
    "describe",
    "draw_uniforms",
    "native_kernels",
    "select",
]

IMPLEMENTATIONS = ("torch", "c", "triton")


def select(program, dtype: torch.dtype, prefer: str | None = None):
    """The implementation that evaluates ``program`` (on its device) for logits of ``dtype``.

    program: a circuit's ``Program``, which gets ``Passes``: float32 on CUDA takes the Triton passes
    when triton imports, float32 on the CPU the fused C passes when their library is available,
    everything else the torch passes. Or a ``circuits.dp.Lattice``, which gets the DP's sweeps: the
    fused C sweeps (``CDP``) for float32 on the CPU when their library is available, else the torch
    sweeps (``TorchDP``; there is no Triton DP). Or ``circuits.native.rows.Rows``, for the row
    operations (top-k, k-th largest, uniforms): their C library under the same rule, or None for
    their torch references.

    ``prefer`` ("torch", "c" or "triton") takes that implementation instead, whatever the device (the
    tests run the Triton passes on CPU tensors under TRITON_INTERPRET=1): ValueError for other than
    float32 logits (but "torch") and for "c" off the CPU, ImportError or RuntimeError when the
    implementation is unavailable.
    """
    if isinstance(program, rows.Rows):  # plain functions: the library itself, or None
        return rows.ROWS.takes(program.device, dtype) if prefer in (None, "c") else None
    dp = isinstance(program, Lattice)
    if prefer is None:
        prefer = _default(program, dtype, c_dp.NATIVE if dp else c_library.NATIVE)
    elif prefer not in IMPLEMENTATIONS or (dp and prefer == "triton"):
        raise ValueError(
            f"prefer must be None, {', '.join(map(repr, IMPLEMENTATIONS[: 2 if dp else 3]))}, got "
            f"{prefer!r}{' (the DP has no Triton sweeps)' if dp and prefer == 'triton' else ''}"
        )
    elif prefer != "torch" and dtype != torch.float32:
        raise ValueError(f"the {prefer} passes take float32 logits, got {dtype}")
    elif prefer == "c" and program.device.type != "cpu":
        raise ValueError(f"the C passes run on the CPU, the program is on {program.device}")
    if dp:
        if prefer == "c" and c_dp.library() is None:  # checked here: the sweeps are kept (_dp_sweeps)
            raise RuntimeError(f"the C DP is not available ({c_dp.describe()})")
        return _dp_sweeps(c_dp.CDP if prefer == "c" else torch_dp.TorchDP, program.kmin, program.kmax)
    if prefer == "triton":
        from .triton_passes import TritonPasses

        return TritonPasses(program)
    return CPasses(program) if prefer == "c" else TorchPasses(program)


@functools.lru_cache(maxsize=256)
def _dp_sweeps(kind, kmin: int, kmax: int):
    """One ``TorchDP`` / ``CDP`` per kind and sizes (they hold nothing but the sizes): kept, as a
    circuit keeps its passes, so that the DP's per-call ``select`` stays cheap."""
    return kind(kmin, kmax)


def _default(program, dtype: torch.dtype, library) -> str:
    """The implementation ``select`` takes on its own: "triton" (circuits only), "c" (where the C
    ``library`` takes the dtype and device) or "torch"."""
    if dtype == torch.float32 and program.device.type == "cuda" and isinstance(program, Program):
        try:
            from . import triton_passes  # noqa: F401 (triton is an optional extra)
        except ImportError:
            return "torch"
        return "triton"
    if library.takes(program.device, dtype) is not None:
        return "c"
    return "torch"


def native_kernels(evaluator, dtype: torch.dtype, device="cpu") -> bool:
    """Whether ``select`` gives ``evaluator`` fused C kernels for logits of ``dtype`` on ``device``: the
    C DP's sweeps for a ``circuits.CardinalityDP``, the C passes for a ``circuits.Circuit`` (on its own
    device). There the operators (``circuits::chosen_scores`` among them) take their one-pass C paths."""
    lattice = getattr(evaluator, "lattice", None)  # the DP's
    if lattice is not None:
        return isinstance(select(lattice(device), dtype), c_dp.CDP)
    return isinstance(evaluator.passes(dtype), CPasses)


# Under torch.compile the answer is a constant of the graph (the mark of
# torch.compiler.assume_constant_result, set without importing torch._dynamo, as
# probmoe.constraints does): dynamo calls it while tracing instead of tracing through ``select``.
native_kernels._dynamo_marked_constant = True


def describe() -> str:
    """Which passes float32 CPU calls take, and why: one line for reports (fp64 calls take the torch
    passes; fp32 CUDA calls the Triton passes when triton is installed, else the torch passes)."""
    if c_library.library() is not None:
        return f"fused C passes ({c_library.describe()})"
    return f"torch passes ({c_library.describe()})"


# Last, after ``select``: the operators import this package (``select``, ``draw_uniforms``) and the
# DP's cardinality module, which imports the operators back; the DP imports this package's scratch
# pool. Importing them here, once this package's names exist, lets any of circuits.ops,
# circuits.passes and circuits.dp be imported first (``import circuits`` imports none of them).
from .. import ops  # noqa: E402,F401
from ..dp import c_dp, torch_dp  # noqa: E402
from ..dp.cardinality import Lattice  # noqa: E402
