"""``select``: the one place that picks an implementation, for the circuit passes, the cardinality
DP's sweeps and the row operations, from what is evaluated, its device and the logits' dtype; and
``describe``, which of them float32 CPU calls take. The implementations are imported from their
own modules (``circuits.kernels``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from . import c_dp, library, torch_dp
from .c_passes import CPasses
from .lattice import GroupLattice, Lattice
from .rows import RowOps, Rows
from .torch_groups import TorchGroupDP
from .torch_passes import TorchPasses

__all__ = ["IMPLEMENTATIONS", "chosen", "describe", "implementation", "select"]

IMPLEMENTATIONS = ("torch", "c", "triton")
_CHOSEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("circuits_implementation", default=None)


@contextlib.contextmanager
def implementation(name: str | None):
    """Within the block, every evaluation (circuit passes, DP sweeps, row operations) runs on
    implementation ``name`` ("torch", "c" or "triton"; None: ``select``'s own pick) instead of the one
    ``select`` would pick, for debugging and benchmarking: ``with circuits.implementation("torch"):
    probmoe.route(...)``. A call it cannot serve is an error naming why (as ``select``'s ``prefer``):
    "c" on CUDA tensors, "triton" without triton or a GPU (or TRITON_INTERPRET=1), "c" or "triton" on
    other than float32 logits. Per thread and task (a context variable); the evaluations run inside
    the block, compiled or eager, read it when they run."""
    if name is not None and name not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be None or one of {', '.join(map(repr, IMPLEMENTATIONS))}, got {name!r}")
    token = _CHOSEN.set(name)
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def chosen() -> str | None:
    """The implementation an enclosing ``implementation`` block asks for (None outside one)."""
    return _CHOSEN.get()


def select(program, dtype: torch.dtype, prefer: str | None = None):
    """The implementation that evaluates ``program`` (on its device) for logits of ``dtype``.

    program: a circuit's ``Program``, which gets ``Passes``: float32 on CUDA takes the Triton passes
    when triton imports, float32 on the CPU the fused C passes when their library is available,
    everything else the torch passes. Or a ``circuits.kernels.lattice.Lattice``, which gets the DP's
    ``Sweeps``: the Triton lattice kernels (``TritonDP``) for float32 on CUDA when triton imports, the
    fused C sweeps (``CDP``) for float32 on the CPU when their library is available, else the torch
    sweeps (``TorchDP``). Or a ``circuits.kernels.lattice.GroupLattice``, which gets the group DP's
    Triton kernels (``TritonGroupDP``) for float32 on CUDA when triton imports, else its torch
    sweeps (``TorchGroupDP``). Or ``circuits.kernels.rows.Rows``,
    which gets the row operations (top-k, k-th largest, uniforms) as a ``RowOps``: their C library
    under the same rule, else their torch references. Each implementation is given the row
    operations of its device and dtype.

    ``prefer`` ("torch", "c" or "triton") takes that implementation instead, whatever the device (the
    tests run the Triton passes on CPU tensors under TRITON_INTERPRET=1): ValueError for other than
    float32 logits (but "torch"), for "c" off the CPU and for "c" on a group lattice, ImportError or
    RuntimeError when the implementation is unavailable. Without ``prefer``, an enclosing
    ``implementation`` block's choice.
    """
    if prefer is None:
        prefer = chosen()
    if isinstance(program, Rows):
        return _row_ops(program.device, dtype, prefer in (None, "c"))
    dp = isinstance(program, Lattice)
    asked = prefer is not None
    if prefer is None:
        prefer = _default(program, dtype)
    elif prefer not in IMPLEMENTATIONS:
        raise ValueError(f"prefer must be None, {', '.join(map(repr, IMPLEMENTATIONS))}, got {prefer!r}")
    elif prefer != "torch" and dtype != torch.float32:
        raise ValueError(f"the {prefer} passes take float32 logits, got {dtype}")
    elif prefer == "c" and program.device.type != "cpu":
        raise ValueError(f"the C passes run on the CPU, the program is on {program.device}")
    rows = _row_ops(program.device, dtype)
    if isinstance(program, GroupLattice):
        return _group_sweeps(program, rows, prefer, asked)
    if dp:
        if prefer == "c" and library.library() is None:  # checked here: the sweeps are kept (_dp_sweeps)
            raise RuntimeError(f"the C DP is not available ({library.describe()})")
        if prefer == "triton":
            from .triton_dp import TritonDP  # triton is an optional extra

            return _dp_sweeps(TritonDP, program.kmin, program.kmax, rows)
        return _dp_sweeps(c_dp.CDP if prefer == "c" else torch_dp.TorchDP, program.kmin, program.kmax, rows)
    if prefer == "triton":
        from .triton_passes import TritonPasses  # triton is an optional extra

        return TritonPasses(program, rows)
    return CPasses(program, rows) if prefer == "c" else TorchPasses(program, rows)


def _group_sweeps(lattice: GroupLattice, rows: RowOps, prefer: str, asked: bool):
    """The group DP's sweeps for ``prefer`` (checked by ``select``), kept per lattice, kind and row
    operations: the Triton kernels (``TritonGroupDP``) for "triton", else the torch sweeps
    (``TorchGroupDP``, any device and dtype), also where "c" is ``select``'s own pick; ValueError for
    "c" ``asked`` for (there are no C group sweeps)."""
    if prefer == "c" and asked:
        raise ValueError(
            "the group DP has torch sweeps and Triton kernels, no C sweeps, got prefer = 'c': "
            "use the compiled circuit (algorithm 'circuit') for its C passes"
        )
    if prefer == "triton":
        from .triton_group_dp import TritonGroupDP  # triton is an optional extra

        return _kept_group_sweeps(TritonGroupDP, lattice, rows)
    return _kept_group_sweeps(TorchGroupDP, lattice, rows)


@functools.lru_cache(maxsize=64)
def _kept_group_sweeps(kind, lattice: GroupLattice, rows: RowOps):
    return kind(lattice, rows)


def _row_ops(device: torch.device, dtype: torch.dtype, c: bool = True) -> RowOps:
    """The row operations for rows of ``dtype`` on ``device``: the C library's where it takes them
    (and ``c``), the uniforms from it wherever it takes float32 (they are made in float32)."""
    ulib = library.LIBRARY.takes(device, torch.float32) if c else None
    return _kept_row_ops(ulib if dtype == torch.float32 else None, ulib)


@functools.lru_cache(maxsize=16)
def _kept_row_ops(lib, uniforms_lib) -> RowOps:
    return RowOps(lib, uniforms_lib)


@functools.lru_cache(maxsize=256)
def _dp_sweeps(kind, kmin: int, kmax: int, rows: RowOps):
    """One ``TorchDP`` / ``CDP`` / ``TritonDP`` per kind, sizes and row operations (they hold nothing else): kept, as
    a circuit keeps its passes, so that the DP's per-call ``select`` stays cheap."""
    return kind(kmin, kmax, rows)


def _default(program, dtype: torch.dtype) -> str:
    """The implementation ``select`` takes on its own: "triton" (float32 on CUDA), "c" (where the C
    library takes the dtype and device) or "torch"."""
    if dtype == torch.float32 and program.device.type == "cuda":
        try:
            import triton  # noqa: F401 (an optional extra)
        except ImportError:
            return "torch"
        return "triton"
    if library.LIBRARY.takes(program.device, dtype) is not None:
        return "c"
    return "torch"


def describe() -> str:
    """Which passes float32 CPU calls take, and why: one line for reports (fp64 calls take the torch
    passes; fp32 CUDA calls the Triton passes when triton is installed, else the torch passes)."""
    if library.library() is not None:
        return f"fused C passes ({library.describe()})"
    return f"torch passes ({library.describe()})"
