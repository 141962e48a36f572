"""The kernels' interface: ``Kernels``, what every implementation offers the operators, and its two
families, ``Passes`` (the circuit passes over a ``Program``) and ``Sweeps`` (the cardinality DP's
sweeps over a ``Lattice``). ``circuits.kernels.select`` makes one per (program or lattice, dtype),
and the evaluators and operators call nothing else: no caller asks an implementation's type.

The fused queries, ``chosen`` (one draw, the drawn variables by score: ``circuits::chosen_scores``)
and ``chosen_backward`` (its gradient, Eq. 7), are methods of ``Kernels`` with a default composed
from the family's draw and Cov(z) v (``draw``, ``cov``), the row operations and
``circuits.kernels.straight_through``; an implementation that fuses them (the C passes, the C DP, the Triton passes, the Triton lattice)
overrides them and says so (``fused``).

A ``Passes`` object evaluates one ``Program`` (a layout on one device) for one dtype; the
evaluator (``circuits.Circuit``) picks one per (circuit, dtype) with ``circuits.kernels.select``.
Inputs are logits r [T, n] of that dtype on that device, contiguous, already checked by the caller
(the input checks run once per public call, in ``Circuit``). Every pass evaluates r - shift,
``shift`` [T, 1] or None (the exactly-k shift of ``Circuit._shift``): the fused implementations
subtract it as they load a tile, the torch passes first (``shifted``); the same float subtraction
either way, so the same bits. Every pass is also tilted inside (``torch_passes.tilt``: a per-row c
the passes pick themselves, exact for any c), which keeps fp32 answers exact at every logit scale;
log Z and MAP's log-value are those of r - shift. Implementations: ``TorchPasses`` (plain tensor
operations: the stated meaning of every pass and the test oracle of the others), ``CPasses`` (fused
C for fp32 on the CPU) and ``TritonPasses`` (fused Triton kernels for fp32 on CUDA,
``circuits.kernels.triton_passes``). The DP's: ``TorchDP``, ``CDP`` and ``TritonDP`` (Triton lattice kernels for fp32 on CUDA,
``circuits.kernels.triton_dp``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import straight_through
from .program import Program, draw_uniforms
from .rows import REFERENCES, RowOps, exactly_k_shift


def shifted(r: Tensor, shift: Tensor | None, dtype: torch.dtype | None = None) -> Tensor:
    """r [T, n] less shift [T, 1] (None: r itself); with ``dtype``, both converted to it first (the
    float64 difference of fp32 inputs is exact, the float32 one is rounded)."""
    if dtype is not None:
        r, shift = r.to(dtype), None if shift is None else shift.to(dtype)
    return r if shift is None else r - shift


class Kernels:
    """What every implementation offers the operators beyond its family's queries: the fused queries,
    each composed by default from ``draw`` and ``cov`` (one exact draw, Cov(z) v) and the row
    operations ``rows`` (``select`` gives them; the torch references without it). None
    synchronises with the host."""

    name = "abstract"
    #: Whether ``chosen`` and ``chosen_backward`` are one fused pass each here (else composed): where
    #: they are, a training route is one operator (``circuits.native_kernels``, ``probmoe.route``).
    fused = False

    def __init__(self, rows: RowOps = REFERENCES):
        self.rows = rows

    def draw(self, r: Tensor, seed: Tensor) -> Tensor:
        """One exact draw z [T, n] in {0, 1} from ``seed`` (a 0-dim int64 tensor), the one the
        family's sampling query makes from it."""
        raise NotImplementedError

    def cov(self, r: Tensor, v: Tensor) -> Tensor:
        """Cov(z) v = (d marginals / d r) v: r, v [T, n] -> [T, n]."""
        raise NotImplementedError

    def chosen(self, r: Tensor, seed: Tensor, p: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
        """The forward of ``circuits::chosen_scores``: ``draw``'s z from ``seed``, then the drawn
        variables by the scores p [T, n] descending (ties to the lower index) in ``slots`` slots ->
        (weights [T, slots] = p there, indices [T, slots] long, mask [T, slots] bool); unused slots
        hold the lowest undrawn variables, ascending (distinct), weight 0."""
        top, idx = self.rows.topk_chosen(self.draw(r, seed), p, slots)  # the drawn by p, then the rest by index (-1)
        mask = top >= 0
        return torch.where(mask, top, 0.0), idx.contiguous(), mask  # the reference slices a sort

    def chosen_backward(self, r: Tensor, indices: Tensor, mask: Tensor, g: Tensor, kind: str, paper: bool) -> Tensor:
        """The gradient of ``chosen``'s weights (Eq. 7): r [T, n], indices [T, slots] (int32 or long),
        mask [T, slots] bool, g [T, slots] -> [T, n] = J(g_t) + the scores' backward of g_t, g_t =
        (g at the used slots, scattered to their variables) ⊙ π, π = softmax(r) or sigmoid(r)
        (``kind``), J = Cov(z) (times diag(1 - sigmoid(r)) with ``paper``)."""
        p = straight_through.scores(r, kind)
        g_t = straight_through.slot_tangents(indices, mask, g, p)
        cov = self.cov(r, g_t)
        if paper:
            cov = cov * torch.sigmoid(-r)
        return (cov + straight_through.scores_backward(g_t, p, kind)).contiguous()


class Passes(Kernels):
    """The passes over ``program``. Subclasses implement every pass; none synchronises with the host."""

    def __init__(self, program: Program, rows: RowOps = REFERENCES):
        super().__init__(rows)
        self.program = program

    def draw_uniforms(self, r: Tensor, seed: Tensor) -> tuple[Tensor, Tensor | None]:
        """The uniforms of one draw per token of r [T, n] from ``seed`` (``program.draw_uniforms``)."""
        return draw_uniforms(self.program, r, seed, self.rows)

    def shift(self, r: Tensor) -> Tensor | None:
        """The exactly-k shift of ``program.shift_k`` for checked logits r [T, n] (``Circuit._shift``):
        each row's k-th largest logit, [T, 1], or None."""
        k = self.program.shift_k
        if k == 0 or r.shape[0] == 0:
            return None
        return exactly_k_shift(self.rows.kth_largest(r.detach(), k))

    def draw(self, r: Tensor, seed: Tensor) -> Tensor:
        return self.sample(r, *self.draw_uniforms(r, seed), shift=self.shift(r), log_z=False)[0].contiguous()

    def cov(self, r: Tensor, v: Tensor) -> Tensor:
        return self.marginals_jvp(r, v, shift=self.shift(r))

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


class Sweeps(Kernels):
    """The cardinality DP's sweeps over kmin..kmax true variables (a ``Lattice``, on the logits'
    device). Subclasses implement every sweep; none synchronises with the host."""

    def __init__(self, kmin: int, kmax: int, rows: RowOps = REFERENCES):
        super().__init__(rows)
        self.kmin, self.kmax = kmin, kmax

    def forward_marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        """(m [T, N] or zeros (``values`` False), one draw [T, N] from ``seed`` or an empty tensor)."""
        raise NotImplementedError

    def cov_vec(self, r: Tensor, v: Tensor) -> Tensor:
        """Cov(z) v: r, v [T, N] -> [T, N]."""
        raise NotImplementedError

    def log_counts(self, r: Tensor, paper: bool) -> Tensor:
        """log Z_j = log Σ_{|S| = j} exp(r·z_S) for j = kmin..kmax: r [T, N] -> [T, J] (-inf: no S of
        size j); ``paper``: log P_indep(|S| = j)."""
        raise NotImplementedError

    def log_counts_backward(self, r: Tensor, g: Tensor, paper: bool) -> Tensor:
        """The gradient of Σ_j g_j log Z_j, g [T, J]: [T, N]."""
        raise NotImplementedError

    def draw(self, r: Tensor, seed: Tensor) -> Tensor:
        return self.forward_marginals(r, seed, False)[1]

    def cov(self, r: Tensor, v: Tensor) -> Tensor:
        return self.cov_vec(r, v)
