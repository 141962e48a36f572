"""``CardinalityDP``: a cardinality constraint (``ExactlyK`` / ``RangeK``) evaluated by the dynamic
program over the variables: an ``circuits.evaluator.Evaluator`` like ``circuits.Circuit``, with no
compilation.

The same queries, shapes and gradients as a compiled circuit of the same spec (log Z, the
marginals with their Cov(z) v backward, exact draws, the MAP), reached through registered
operators (``circuits::dp_marginals``, ``circuits::dp_cov_vec``, ``circuits::dp_log_counts``) whose kernels
``circuits.kernels.select`` picks for the logits' device and dtype (the fused C sweeps for float32
on the CPU, the Triton lattice kernels for float32 on CUDA, the torch sweeps elsewhere). Beyond the circuit's queries it gives the log-count of
every size, ``log_counts`` (one sweep where a circuit needs one compiled circuit per size).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import checks
from ..evaluator import Evaluator
from ..kernels.interface import Sweeps
from ..kernels.lattice import Lattice
from ..kernels.select import select
from ..spec import CARDINALITY_SPECS as SPECS  # the constraints the DP evaluates
from ..spec import ExactlyK, RangeK
from .map_rule import map_mask


class CardinalityDP(Evaluator):
    """P(x) ∝ Π p^x (1 - p)^(1 - x) on kmin <= Σ x <= kmax, evaluated by the DP on ``device``.
    ``spec``: an ``ExactlyK`` or ``RangeK`` (ValueError for anything else: other constraints need a
    compiled circuit). The shapes, checks and queries of ``circuits.evaluator.Evaluator``; its value
    checks (on the CPU two host synchronisations per call, on CUDA assertions in the graph:
    ``circuits.checks``) come before the sweeps."""

    counts_by_size = True

    def __init__(self, spec: ExactlyK | RangeK, device="cpu"):
        if not isinstance(spec, SPECS):
            raise ValueError(
                f"the DP evaluates ExactlyK and RangeK specs, got {type(spec).__name__}; other "
                "constraints need a compiled circuit (circuits.compile_circuit)"
            )
        super().__init__(spec, spec.n, torch.empty(0, device=device).device)  # resolved: "cuda" becomes "cuda:0"
        self.lattice = Lattice(self.n, self.kmin, self.kmax, self.device)

    def __repr__(self) -> str:
        return f"CardinalityDP({self.spec.describe()}, device={self.device})"

    def to(self, device) -> CardinalityDP:
        return CardinalityDP(self.spec, device)

    def kernels(self, dtype: torch.dtype) -> Sweeps:
        """The DP's sweeps for logits of ``dtype`` on this device (``circuits.kernels.select``)."""
        return select(self.lattice, dtype)

    # --- the checks: before the sweeps ----------------------------------------------------------
    def _check_values(self, r: Tensor) -> None:
        """ValueError for NaN, +inf or |logits| >= ``checks.MAX_ABS_LOGIT`` in r [T, n], or a row with
        fewer than kmin logits above -inf: on the CPU two host synchronisations, on CUDA and under
        torch.compile assertions in the graph (``checks.in_graph``)."""
        checks.logit_values(r)
        self._require_satisfiable(r)

    def _require_satisfiable(self, r: Tensor) -> None:
        if self.kmin:
            live = (r > -torch.inf).sum(-1)  # [T]
            checks.require(
                live.amin() >= self.kmin,
                f"some row of the logits has fewer than kmin = {self.kmin} "
                f"logits above -inf: {self.spec.describe()} is unsatisfiable",
            )

    def check_satisfiable(self, logits: Tensor) -> None:
        """Raise ValueError when some row of ``logits`` [..., n] has fewer than kmin entries above
        -inf (an assertion in the graph on CUDA and under torch.compile). NaN and +inf count as finite."""
        checks.logits(logits, n=self.n, device=self.device)
        r = logits.reshape(-1, self.n)  # [T, n]
        if r.shape[0]:
            self._require_satisfiable(r)

    # --- the queries on checked logits r [T, n], through the ``dp_`` operators of ``circuits.ops`` ---
    def _log_partition(self, r: Tensor) -> Tensor:
        """From the DP on log-probabilities (no cancellation)."""
        counts = torch.ops.circuits.dp_log_counts(r, self.kmin, self.kmax, True)  # [T, J]
        return torch.logsumexp(counts, dim=-1)  # [T, J] -> [T]

    def log_normalizer(self, logits: Tensor) -> Tensor:
        """``Evaluator.log_normalizer`` from the DP's natural counts by size (no cancellation)."""
        return torch.logsumexp(self.log_counts(logits), dim=-1)

    def log_counts(self, logits: Tensor) -> Tensor:
        """log Σ_{|S| = j} exp(Σ_{i∈S} r_i) for j = kmin..kmax: [..., n] -> [..., J] (-inf where no
        subset has j variables); differentiable (its gradient: one downward sweep)."""
        r, lead = self._inputs(logits)
        counts = torch.ops.circuits.dp_log_counts(r, self.kmin, self.kmax, False)  # [T, J]
        return counts.reshape(*lead, counts.shape[-1]).to(logits.dtype)

    def _marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        return torch.ops.circuits.dp_marginals(r, seed, self.kmin, self.kmax, values)

    def _sample(self, r: Tensor, seed: Tensor) -> Tensor:
        return self._marginals(r, seed, False)[1]

    def _map(self, r: Tensor) -> Tensor:
        """In closed form (``circuits.dp.map_rule``)."""
        return map_mask(r, self.kmin, self.kmax)
