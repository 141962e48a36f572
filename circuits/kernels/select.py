"""``select``: the one place that picks an implementation, for the circuit passes, the cardinality
DP's sweeps and the row operations, from what is evaluated, its device and the logits' dtype.

``circuits.passes`` names this module (``circuits.passes.select``, ``describe``, and the
implementations' classes ``Passes``, ``TorchPasses``, ``CPasses``, ``Program``, ``draw_uniforms``).
"""

from __future__ import annotations

import functools

import torch

from . import c_dp, c_library, rows_lib, torch_dp
from .c_passes import CPasses
from .interface import Passes
from .lattice import Lattice
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
    "select",
]

IMPLEMENTATIONS = ("torch", "c", "triton")


def select(program, dtype: torch.dtype, prefer: str | None = None):
    """The implementation that evaluates ``program`` (on its device) for logits of ``dtype``.

    program: a circuit's ``Program``, which gets ``Passes``: float32 on CUDA takes the Triton passes
    when triton imports, float32 on the CPU the fused C passes when their library is available,
    everything else the torch passes. Or a ``circuits.kernels.lattice.Lattice``, which gets the DP's sweeps: the
    fused C sweeps (``CDP``) for float32 on the CPU when their library is available, else the torch
    sweeps (``TorchDP``; there is no Triton DP). Or ``circuits.kernels.rows_lib.Rows``, for the row
    operations (top-k, k-th largest, uniforms): their C library under the same rule, or None for
    their torch references.

    ``prefer`` ("torch", "c" or "triton") takes that implementation instead, whatever the device (the
    tests run the Triton passes on CPU tensors under TRITON_INTERPRET=1): ValueError for other than
    float32 logits (but "torch") and for "c" off the CPU, ImportError or RuntimeError when the
    implementation is unavailable.
    """
    if isinstance(program, rows_lib.Rows):  # plain functions: the library itself, or None
        return rows_lib.ROWS.takes(program.device, dtype) if prefer in (None, "c") else None
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


def describe() -> str:
    """Which passes float32 CPU calls take, and why: one line for reports (fp64 calls take the torch
    passes; fp32 CUDA calls the Triton passes when triton is installed, else the torch passes)."""
    if c_library.library() is not None:
        return f"fused C passes ({c_library.describe()})"
    return f"torch passes ({c_library.describe()})"
