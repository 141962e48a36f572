"""``GroupDP``: a group constraint (``GroupLimited`` / ``GroupCapacity``) evaluated by the group DP's
two-level lattice (``circuits.kernels.torch_groups``): an ``circuits.evaluator.Evaluator`` like
``circuits.Circuit``, with no compilation.

The same queries, shapes and gradients as a compiled circuit of the same spec (log Z, the marginals
with their Cov(z) v backward, exact draws, the MAP, the straight-through selection), reached
through the same registered operators (``circuits.ops``: ``log_partition``, ``marginals``,
``marginals_jvp``, ``sample``, ``map``, ``chosen_scores``), whose kernels ``circuits.kernels.select``
picks from a ``circuits.kernels.lattice.GroupLattice``: the fused Triton kernels for float32 logits on
CUDA (``circuits.kernels.triton_group_dp``), the torch sweeps elsewhere. Beyond the
circuit's queries, the log-count of every size from one pass (``log_counts``, ``circuits::group_log_counts``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import checks
from ..evaluator import Evaluator
from ..kernels.interface import Kernels
from ..kernels.lattice import GroupLattice
from ..kernels.select import select
from ..spec import GROUP_SPECS, GroupCapacity, GroupLimited


class GroupDP(Evaluator):
    """P(x) ∝ Π p^x (1 - p)^(1 - x) on the assignments a group spec allows, evaluated by the group
    DP on ``device``. ``spec``: a ``GroupLimited`` or ``GroupCapacity`` (ValueError for anything
    else). The shapes, checks and queries of ``circuits.evaluator.Evaluator``; its value checks
    (on the CPU two host synchronisations per call, on CUDA assertions in the graph:
    ``circuits.checks``) come before the sweeps."""

    counts_by_size = True

    def __init__(self, spec: GroupLimited | GroupCapacity, device="cpu"):
        if not isinstance(spec, GROUP_SPECS):
            raise ValueError(f"the group DP evaluates GroupLimited and GroupCapacity specs, got {type(spec).__name__}")
        super().__init__(spec, spec.n, torch.empty(0, device=device).device)  # resolved: "cuda" becomes "cuda:0"
        self.lattice = GroupLattice(spec, self.device)

    def __repr__(self) -> str:
        return f"GroupDP({self.spec.describe()}, device={self.device})"

    def to(self, device) -> GroupDP:
        return GroupDP(self.spec, device)

    def kernels(self, dtype: torch.dtype) -> Kernels:
        """The group DP's sweeps for logits of ``dtype`` on this device (``circuits.kernels.select``)."""
        return select(self.lattice, dtype)

    # --- the checks: before the sweeps ----------------------------------------------------------
    def _check_values(self, r: Tensor) -> None:
        """ValueError for NaN, +inf or |logits| >= ``checks.MAX_ABS_LOGIT`` in r [T, n], or a row whose
        -inf logits leave no allowed assignment: on the CPU two host synchronisations, on CUDA and
        under torch.compile assertions in the graph (``checks.in_graph``)."""
        checks.logit_values(r)
        self._require_satisfiable(r)

    def reach(self, r: Tensor) -> Tensor:
        """The most true variables each row of r [T, n] allows with its logits above -inf: the
        max_groups groups with the most such variables (each counted up to the capacity). [T] long."""
        live = torch.split((r > -torch.inf).long(), list(self.spec.groups), dim=-1)
        per_group = torch.stack([g.sum(-1) for g in live], dim=-1).clamp(max=self.spec.capacity)  # [T, G]
        return per_group.topk(self.spec.max_groups, dim=-1).values.sum(-1)

    def _require_satisfiable(self, r: Tensor) -> None:
        if self.kmin:
            checks.require(
                self.reach(r).amin() >= self.kmin,
                f"some row of the logits leaves fewer than kmin = {self.kmin} logits above -inf that "
                f"{self.spec.describe()} can take together: the constraint is unsatisfiable there",
            )

    def check_satisfiable(self, logits: Tensor) -> None:
        """Raise ValueError when some row of ``logits`` [..., n] has -inf entries that leave no
        allowed assignment (an assertion in the graph on CUDA and under torch.compile). NaN and +inf
        count as finite."""
        checks.logits(logits, n=self.n, device=self.device)
        r = logits.reshape(-1, self.n)  # [T, n]
        if r.shape[0]:
            self._require_satisfiable(r)

    # --- the queries on checked logits r [T, n] (each one registered operator, ``circuits.ops``) -------
    def _log_partition(self, r: Tensor) -> Tensor:
        log_z, _ = torch.ops.circuits.log_partition(r, self.handle, r.requires_grad and torch.is_grad_enabled())
        return log_z

    def _marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        m, z, _ = torch.ops.circuits.marginals(r, None, seed, self.handle, values, False)
        return m, z

    def log_counts(self, logits: Tensor) -> Tensor:
        """log Σ_{z allowed, |z| = j} exp(Σ_{i∈z} r_i) for j = kmin..kmax: [..., n] -> [..., J] (-inf
        where nothing allowed has j true), every size from one pass; differentiable (its gradient:
        one adjoint pass)."""
        r, lead = self._inputs(logits)
        counts = torch.ops.circuits.group_log_counts(r, self.handle, self.kmin, self.kmax, False)  # [T, J]
        return counts.reshape(*lead, counts.shape[-1]).to(logits.dtype)

    def log_normalizer(self, logits: Tensor) -> Tensor:
        """``Evaluator.log_normalizer`` from the counts by size (no cancellation)."""
        return torch.logsumexp(self.log_counts(logits), dim=-1)

    def _sample(self, r: Tensor, seed: Tensor) -> Tensor:
        return torch.ops.circuits.sample(r, None, seed, self.handle)[0]

    def _map(self, r: Tensor) -> Tensor:
        return torch.ops.circuits.map(r, None, self.handle)[0]
