"""``Passes``: the one interface every implementation of the circuit passes offers.

A ``Passes`` object evaluates one ``Program`` (a layout on one device) for one dtype; the
evaluator (``circuits.Circuit``) picks one per (circuit, dtype) with ``circuits.passes.select``
and calls nothing else. Inputs are logits r [T, n] of that dtype on that device, contiguous,
already checked by the caller (the input checks run once per public call, in ``Circuit``).
Implementations: ``TorchPasses`` (plain tensor operations: the stated meaning of every pass and
the test oracle of the others), ``CPasses`` (fused C for fp32 on the CPU) and ``TritonPasses``
(fused Triton kernels for fp32 on CUDA, ``circuits.passes.triton_passes``).
"""

from __future__ import annotations

from torch import Tensor

from .program import Program


class Passes:
    """The passes over ``program``. Subclasses implement every method; none synchronises with the host."""

    name = "abstract"

    def __init__(self, program: Program):
        self.program = program

    def log_partition(self, r: Tensor, marginals: bool) -> tuple[Tensor, Tensor | None]:
        """(log Z [T], P(x_i = 1 | C) [T, n] when ``marginals``, else None): upward, downward."""
        raise NotImplementedError

    def sample(self, r: Tensor, uniforms: Tensor, fill: Tensor | None) -> tuple[Tensor, Tensor]:
        """(one exact draw z [T, n] in {0, 1}, log Z [T]) from the uniforms of
        ``program.draw_uniforms``: [count, T] and [T, n] (None for a smooth circuit)."""
        raise NotImplementedError

    def map(self, r: Tensor) -> tuple[Tensor, Tensor]:
        """(the most probable satisfying assignment [T, n] in {0, 1}, its log-value [T]; -inf where
        nothing satisfies)."""
        raise NotImplementedError

    def marginals_jvp(self, r: Tensor, v: Tensor) -> Tensor:
        """Cov(z) v = (d marginals / d r) v: r, v [T, n] -> [T, n]."""
        raise NotImplementedError

