"""``Passes``: the one interface every implementation of the circuit passes offers.

A ``Passes`` object evaluates one ``Program`` (a layout on one device) for one dtype; the
evaluator (``circuits.Circuit``) picks one per (circuit, dtype) with ``circuits.kernels.select``
and calls nothing else. Inputs are logits r [T, n] of that dtype on that device, contiguous,
already checked by the caller (the input checks run once per public call, in ``Circuit``).
Every pass evaluates r - shift, ``shift`` [T, 1] or None (the exactly-k shift of
``Circuit._shift``): the fused implementations subtract it as they load a tile, the torch passes
first (``shifted``); the same float subtraction either way, so the same bits. Every pass is also
tilted inside (``torch_passes.tilt``: a per-row c the passes pick themselves, exact for any c), which
keeps fp32 answers exact at every logit scale; log Z and MAP's log-value are those of r - shift.
Implementations: ``TorchPasses`` (plain tensor operations: the stated meaning of every pass and
the test oracle of the others), ``CPasses`` (fused C for fp32 on the CPU) and ``TritonPasses``
(fused Triton kernels for fp32 on CUDA, ``circuits.kernels.triton_passes``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .program import Program


def shifted(r: Tensor, shift: Tensor | None, dtype: torch.dtype | None = None) -> Tensor:
    """r [T, n] less shift [T, 1] (None: r itself); with ``dtype``, both converted to it first (the
    float64 difference of fp32 inputs is exact, the float32 one is rounded)."""
    if dtype is not None:
        r, shift = r.to(dtype), None if shift is None else shift.to(dtype)
    return r if shift is None else r - shift


class Passes:
    """The passes over ``program``. Subclasses implement every method; none synchronises with the host."""

    name = "abstract"

    def __init__(self, program: Program):
        self.program = program

    def log_partition(
        self, r: Tensor, marginals: bool, shift: Tensor | None = None, *, accurate: bool = True, refine: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """(log Z [T], P(x_i = 1 | C) [T, n] when ``marginals``, else None): upward, downward.
        ``accurate``: log Z accumulated in float64 (fp32 within 1e-6 relative of a float64
        reference); False: in r's dtype, for callers that only check it is finite. ``refine``:
        for a ``program.float64_rows`` circuit, the fp32 marginals of the rows a float32 pass on
        logarithms evaluated come from the float64 passes (all rows for passes that have only that
        pass; the C passes' linear tiles keep theirs)."""
        raise NotImplementedError

    def sample(
        self, r: Tensor, uniforms: Tensor, fill: Tensor | None, shift: Tensor | None = None, log_z: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """(one exact draw z [T, n] in {0, 1}, log Z [T]) from the uniforms of
        ``program.draw_uniforms``: [count, T] and [T, n] (None for a smooth circuit). ``log_z``
        False: log Z is not wanted (None, or computed anyway where it costs nothing more)."""
        raise NotImplementedError

    def map(self, r: Tensor, shift: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(the most probable satisfying assignment [T, n] in {0, 1}, its log-value [T]; -inf where
        nothing satisfies)."""
        raise NotImplementedError

    def marginals_jvp(self, r: Tensor, v: Tensor, shift: Tensor | None = None) -> Tensor:
        """Cov(z) v = (d marginals / d r) v: r, v [T, n] -> [T, n]."""
        raise NotImplementedError
