"""``CardinalityDP``: a cardinality constraint (``ExactlyK`` / ``RangeK``) evaluated by the dynamic
program over the variables, with the queries of ``circuits.Circuit`` and no compilation.

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

from .. import checks, ops
from ..kernels.lattice import Lattice
from ..kernels.select import select
from ..spec import CARDINALITY_SPECS as SPECS  # the constraints the DP evaluates
from ..spec import ExactlyK, RangeK
from .map_rule import map_mask


class CardinalityDP:
    """P(x) ∝ Π p^x (1 - p)^(1 - x) on kmin <= Σ x <= kmax, evaluated by the DP. ``spec``: an
    ``ExactlyK`` or ``RangeK`` (ValueError for anything else: other constraints need a compiled
    circuit). Set ``validate = False`` to skip the checks on logit values (on the CPU two host
    synchronisations per call, on CUDA assertions in the graph: ``circuits.checks``), as for a
    ``Circuit``."""

    def __init__(self, spec: ExactlyK | RangeK):
        if not isinstance(spec, SPECS):
            raise ValueError(
                f"the DP evaluates ExactlyK and RangeK specs, got {type(spec).__name__}; other "
                "constraints need a compiled circuit (circuits.compile_circuit)"
            )
        self.spec = spec
        self.n = spec.n
        self.kmin, self.kmax = spec.cardinalities[0], spec.cardinalities[-1]
        self.validate = True
        self.handle = ops.register(self)  # the ``circuit`` argument of ``circuits::chosen_scores``

    def __repr__(self) -> str:
        return f"CardinalityDP({self.spec.describe()})"

    def lattice(self, device) -> Lattice:
        return Lattice(self.n, self.kmin, self.kmax, torch.device(device))

    def kernels(self, dtype: torch.dtype, device="cpu"):
        """The DP's kernels (``Sweeps``) for logits of ``dtype`` on ``device`` (``circuits.kernels.select``)."""
        return select(self.lattice(device), dtype)

    # --- inputs and checks --------------------------------------------------------------------
    def _inputs(self, logits: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, torch.Size]:
        """Logits as [T, n] float32/float64, contiguous, and the leading shape; checked (arguments and
        values) unless ``validate`` is False (a caller that checked them: probmoe does)."""
        if self.validate:
            checks.logits(logits, n=self.n)
            checks.generator(generator, logits.device)
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        r = (logits if logits.dim() == 2 else logits.reshape(-1, self.n)).to(dtype).contiguous()  # [T, n]: no view node
        if self.validate and r.shape[0]:
            self._check(r)
        return r, logits.shape[:-1]

    def _check(self, r: Tensor) -> None:
        """ValueError for NaN, +inf or |logits| >= ``checks.MAX_ABS_LOGIT`` in r [T, n], or a row with
        fewer than kmin logits above -inf: on the CPU two host synchronisations, on CUDA and under
        torch.compile assertions in the graph (``checks.in_graph``)."""
        checks.logit_values(r)
        if self.kmin:
            live = (r > -torch.inf).sum(-1)  # [T]
            checks.require(
                live.amin() >= self.kmin,
                f"some row of the logits has fewer than kmin = {self.kmin} "
                f"logits above -inf: {self.spec.describe()} is unsatisfiable",
            )

    def _marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        return torch.ops.circuits.dp_marginals(r, seed, self.kmin, self.kmax, values)

    # --- the queries of a Circuit ----------------------------------------------------------------
    def log_partition(self, logits: Tensor) -> Tensor:
        """log P(constraint) under independent Bernoulli(sigmoid(logits)): [..., n] -> [...], from the
        DP on log-probabilities (no cancellation). d/d logits = marginals - sigmoid(logits)."""
        r, lead = self._inputs(logits)
        counts = torch.ops.circuits.dp_log_counts(r, self.kmin, self.kmax, True)  # [T, J]
        log_z = torch.logsumexp(counts, dim=-1)  # [T, J] -> [T]
        return log_z.reshape(lead).to(logits.dtype)

    def log_counts(self, logits: Tensor) -> Tensor:
        """log Σ_{|S| = j} exp(Σ_{i∈S} r_i) for j = kmin..kmax: [..., n] -> [..., J] (-inf where no
        subset has j variables); differentiable (its gradient: one downward sweep)."""
        r, lead = self._inputs(logits)
        counts = torch.ops.circuits.dp_log_counts(r, self.kmin, self.kmax, False)  # [T, J]
        return counts.reshape(*lead, counts.shape[-1]).to(logits.dtype)

    def marginals(self, logits: Tensor, *, values: bool = True) -> Tensor:
        """P(x_i = 1 | constraint): [..., n] -> [..., n], Jacobian Cov(x) (``Circuit.marginals``)."""
        r, lead = self._inputs(logits)
        m, _ = self._marginals(r, None, values)
        return m.reshape(*lead, self.n).to(logits.dtype)

    def sample(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Exact draws: [..., n] -> [..., n] in {0, 1}, the logits' dtype (``Circuit.sample``)."""
        r, lead = self._inputs(logits, generator)
        with torch.no_grad():
            _, z = self._marginals(r, ops.seed(generator, r), False)
        return z.reshape(*lead, self.n).to(logits.dtype)

    def map(self, logits: Tensor) -> Tensor:
        """The most probable satisfying assignment (``circuits.dp.map_rule``): [..., n] -> [..., n]."""
        r, lead = self._inputs(logits)
        with torch.no_grad():
            return map_mask(r, self.kmin, self.kmax).reshape(*lead, self.n).to(logits.dtype)

    def marginals_and_sample(self, logits: Tensor, generator: torch.Generator | None = None, *, values: bool = True):
        """(marginals, sample) from one up and one down sweep (``Circuit.marginals_and_sample``)."""
        r, lead = self._inputs(logits, generator)
        m, z = self._marginals(r, ops.seed(generator, r), values)
        shape = (*lead, self.n)
        return m.reshape(shape).to(logits.dtype), z.reshape(shape).to(logits.dtype)

    def chosen_scores(
        self,
        logits: Tensor,
        generator: torch.Generator | None = None,
        *,
        slots: int,
        kind: str = "softmax",
        paper: bool = False,
    ):
        """One exact draw and its variables by score with Eq. 7's straight-through weights
        (``Circuit.chosen_scores``): logits [T, n] -> (weights [T, slots], indices [T, slots] long,
        mask [T, slots] bool, π [T, n]); one pass with the C sweeps and the Triton lattice kernels."""
        r, _ = self._inputs(logits, generator)
        return ops.chosen_scores_call(r, generator, self.kmin, self.kmax, self.handle, slots, kind, paper)
