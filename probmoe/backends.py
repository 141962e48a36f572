"""The two exact backends behind ``SubsetDistribution``, with one interface.

- ``"dp"``: the dynamic program over experts in ``probmoe.dp``; needs nothing compiled.
- ``"circuit"``: the compiled circuit of ``circuits.ExactlyK`` / ``circuits.RangeK``, or of a
  structured constraint (``probmoe.constraints``: any compiled circuit over the N experts).

Every method takes logits r [T, N] (float32 or float64, validated by the caller) and returns
tensors over the same T rows. ``marginals`` is differentiable with the Jacobian Cov(z) (exact)
or Cov(z) diag(1 - sigmoid(r)) (``paper=True``); its backward keeps only O(T N) tensors. With
``values=False`` it returns zeros that carry that Jacobian (the circuit then skips its downward pass).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor

from circuits import ops as circuit_ops

from . import constraints, dp, ops  # noqa: F401 (ops registers torch.ops.probmoe)
from .map_rule import map_mask


class PaperGrad(torch.autograd.Function):
    """Identity forward; backward multiplies by 1 - sigmoid(r). Placed in front of an exact-Jacobian
    marginals function it yields the paper / SIMPLE Jacobian Cov(z) diag(1 - p). Saves only r, and
    returns a view of it, so a marginals function that saves its input keeps no second copy."""

    @staticmethod
    def forward(ctx, r: Tensor) -> Tensor:
        ctx.save_for_backward(r)
        return r.view_as(r)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (r,) = ctx.saved_tensors
        return g * torch.sigmoid(-r)


def softplus_sum(r: Tensor) -> Tensor:
    """Σ_i log(1 + e^{r_i}), the gap between the natural and the paper log-partition: [T, N] -> [T]."""
    return F.softplus(r).sum(dim=-1)


class DPBackend:
    """``probmoe.dp``: one upward and one downward sweep over the experts per query."""

    name = "dp"

    def __init__(self, n: int, kmin: int, kmax: int, device):
        self.n, self.kmin, self.kmax = n, kmin, kmax

    def log_counts(self, r: Tensor) -> Tensor:
        """log Σ_{|S| = j} exp(r·z_S), j = kmin..kmax: [T, N] -> [T, J]."""
        return dp.LogCounts.apply(r, self.kmin, self.kmax)

    def log_normalizer(self, r: Tensor) -> Tensor:
        """log Σ_{S ∈ C} exp(r·z_S) (natural form): [T, N] -> [T]."""
        return torch.logsumexp(self.log_counts(r), dim=-1)

    def log_partition(self, r: Tensor) -> Tensor:
        """log P_indep(|S| ∈ C) with p = sigmoid(r) (paper form, without cancellation): [T, N] -> [T]."""
        return torch.logsumexp(dp.LogCounts.apply(r, self.kmin, self.kmax, True), dim=-1)

    def marginals(self, r: Tensor, paper: bool, sample: bool = False, generator=None, values: bool = True):
        """(m [T, N], one draw [T, N] or None): the operator ``probmoe::dp_marginals``."""
        if paper:
            r = PaperGrad.apply(r)
        seed = circuit_ops.seed(generator, r) if sample else None
        m, z = torch.ops.probmoe.dp_marginals(r, seed, self.kmin, self.kmax, values)
        return m, z if sample else None

    def sample(self, r: Tensor, num: int, generator=None) -> Tensor:
        """``num`` exact draws: [T, N] -> [num, T, N]. One draw is the operator's (torch.compile
        traces it); several share one upward sweep of the torch DP."""
        if num == 0:
            return r.new_zeros(0, *r.shape)
        if num == 1:
            return self.marginals(r.detach(), False, sample=True, generator=generator, values=False)[1].unsqueeze(0)
        u = dp.up(r, self.kmin, self.kmax)
        return dp.down(u, u.band_probs(), num, generator)[1]

    def mode(self, r: Tensor) -> Tensor:
        return map_mask(r, self.kmin, self.kmax)


class CircuitBackend:
    """``circuits``: the compiled circuit of the constraint (one per size for ``log_counts``).

    constraint: None (the cardinality kmin..kmax) or a resolved ``probmoe.constraints`` constraint,
    whose smallest and largest subsets are kmin and kmax.
    """

    name = "circuit"

    def __init__(self, n: int, kmin: int, kmax: int, device, constraint=None):
        self.n, self.kmin, self.kmax, self.device = n, kmin, kmax, str(torch.device(device))
        self.constraint = constraint
        if constraint is None:
            self.circuit = constraints.cardinality(n, kmin, kmax, self.device)
        else:
            self.circuit = constraints.compiled(constraint, self.device)

    def _size(self, j: int):
        """The circuit of the subsets of exactly j experts (that the constraint allows)."""
        if self.constraint is None:
            return constraints.cardinality(self.n, j, j, self.device)
        if self.kmin == self.kmax:
            return self.circuit
        if not hasattr(self.constraint, "with_cardinality"):
            raise ValueError(f"cardinality_probs needs a constraint spec with a size range (GroupLimited, "
                             f"GroupCapacity); {constraints.describe(self.constraint)} allows {self.kmin}..{self.kmax} "
                             "experts and cannot be split by size")
        return constraints.compiled(self.constraint.with_cardinality(j, j), self.device)

    def log_counts(self, r: Tensor) -> Tensor:
        sizes = [self._size(j) for j in range(self.kmin, self.kmax + 1)]
        paper = torch.stack([c.log_partition(r) for c in sizes], dim=-1)  # [T, J]
        return paper + softplus_sum(r).unsqueeze(-1)

    def log_normalizer(self, r: Tensor) -> Tensor:
        return self.log_partition(r) + softplus_sum(r)

    def log_partition(self, r: Tensor) -> Tensor:
        return self.circuit.log_partition(r)

    def marginals(self, r: Tensor, paper: bool, sample: bool = False, generator=None, values: bool = True):
        if paper:
            r = PaperGrad.apply(r)
        if sample:
            return self.circuit.marginals_and_sample(r, generator, values=values)
        return self.circuit.marginals(r, values=values), None

    def sample(self, r: Tensor, num: int, generator=None) -> Tensor:
        T, N = r.shape
        return self.circuit.sample(r.expand(num, T, N), generator)

    def mode(self, r: Tensor) -> Tensor:
        return self.circuit.map(r)


BACKENDS = {"dp": DPBackend, "circuit": CircuitBackend}


def make(name: str, n: int, kmin: int, kmax: int, device, constraint=None):
    """The backend ``name`` (a key of ``BACKENDS``, checked by the caller; a ``constraint`` only with
    "circuit", also checked by the caller)."""
    if constraint is not None:
        return CircuitBackend(n, kmin, kmax, device, constraint)
    return BACKENDS[name](n, kmin, kmax, device)
