"""``Evaluator``: what the two algorithms share, the compiled circuit (``circuits.Circuit``) and the
dynamic programs (``circuits.CardinalityDP``, ``circuits.GroupDP``): the shapes, the checks and the queries.

Every query takes logits [..., n] (log-odds of independent Bernoulli variables) on the evaluator's
device, checks them once (unless ``validate`` is False), flattens the leading dimensions into T
tokens (contiguous [T, n] in float32, or float64 for float64 logits), runs the algorithm's operators
(``circuits.ops``) on them, and restores the leading dimensions and the logits' dtype. Logits of
-inf mean "never true". A subclass gives the algorithm: ``kernels`` and the queries on checked
[T, n] logits (``_log_partition``, ``_marginals``, ``_sample``, ``_map``), and where its value
checks run (``_check_values``: before any pass; the circuit's come after its first pass, from its
log Z).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import checks, ops
from .kernels.interface import Kernels


class Evaluator:
    """The queries of a constraint (``spec``, None for a circuit read without one) over ``n``
    variables, evaluated on ``device``: log Z, the marginals (Jacobian Cov(z)), exact draws, the MAP,
    the marginals and a draw from one pass, and the straight-through selection (``chosen_scores``).
    ``kmin``..``kmax``: the numbers of true variables its models may have (0..n when not known).

    Set ``validate = False`` to skip the checks on the logits (a caller that has checked them: on
    the CPU they cost host synchronisations, on CUDA they are assertions in the graph,
    ``circuits.checks``). ``handle``: the ``circuit`` argument of the operators (``ops.register``).
    """

    counts_by_size = False  # whether ``log_counts`` gives every size kmin..kmax from one pass

    def __init__(self, spec, n: int, device: torch.device):
        self.spec, self.n, self.device = spec, n, device
        cards = getattr(spec, "cardinalities", None) or range(n + 1)
        self.kmin, self.kmax = cards[0], cards[-1]
        self.validate = True
        self.handle = ops.register(self)

    # --- what a subclass gives -----------------------------------------------------------------
    def kernels(self, dtype: torch.dtype) -> Kernels:
        """The kernels that calls with ``dtype`` logits take on this device (``circuits.kernels.select``)."""
        raise NotImplementedError

    def to(self, device) -> Evaluator:
        """The same evaluator on ``device``."""
        raise NotImplementedError

    def check_satisfiable(self, logits: Tensor) -> None:
        """Raise ValueError when some row of ``logits`` [..., n] has -inf entries that leave no
        satisfying assignment (an assertion in the graph on CUDA and under torch.compile)."""
        raise NotImplementedError

    def _check_values(self, r: Tensor) -> None:
        """The value checks on checked logits r [T, n] (T > 0) made before any pass (none here)."""

    def _log_partition(self, r: Tensor) -> Tensor:
        """log Z [T] of checked logits r [T, n], differentiable (``log_partition``)."""
        raise NotImplementedError

    def _marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        """(marginals, or zeros carrying their Jacobian unless ``values``, [T, n]; one draw [T, n] from
        ``seed`` or an empty tensor) of checked logits r [T, n]."""
        raise NotImplementedError

    def _sample(self, r: Tensor, seed: Tensor) -> Tensor:
        """One exact draw [T, n] from ``seed`` for checked logits r [T, n] (no gradient)."""
        raise NotImplementedError

    def _map(self, r: Tensor) -> Tensor:
        """The most probable satisfying assignment [T, n] of checked logits r [T, n] (no gradient)."""
        raise NotImplementedError

    def _check_chosen(self, r: Tensor) -> None:
        """The value checks ``chosen_scores`` makes on checked logits r [T, n] (T > 0) beyond
        ``_check_values`` (its operator reports no log Z to check)."""

    # --- shapes and checks ---------------------------------------------------------------------
    def _inputs(self, logits: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, torch.Size]:
        """[..., n] -> contiguous float32/float64 [T, n] on this device, plus the leading shape; the
        argument checks of every query, and ``_check_values`` (unless ``validate`` is False)."""
        if self.validate:
            checks.logits(logits, n=self.n, device=self.device)
            checks.generator(generator, self.device)
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        r = (
            (logits if logits.dim() == 2 else logits.reshape(-1, self.n)).to(dtype).contiguous()
        )  # no view node for [T, n]
        if self.validate and r.shape[0]:
            self._check_values(r)
        return r, logits.shape[:-1]

    def _out(self, x: Tensor, lead: torch.Size, logits: Tensor) -> Tensor:
        """[T, n] -> [..., n] in the logits' dtype."""
        return x.reshape(*lead, self.n).to(logits.dtype)

    # --- the queries -----------------------------------------------------------------------------
    def log_partition(self, logits: Tensor) -> Tensor:
        """log P(constraint) under independent Bernoulli(sigmoid(logits)): [..., n] -> [...].
        Differentiable: d/d logits = marginals - sigmoid(logits) (the circuit's twice)."""
        r, lead = self._inputs(logits)
        return self._log_partition(r).reshape(lead).to(logits.dtype)

    def log_normalizer(self, logits: Tensor) -> Tensor:
        """log Σ_{z ⊨ C} exp(logits·z): [..., n] -> [...], the natural form of ``log_partition``
        (which it exceeds by Σ softplus(logits)); differentiable."""
        return self.log_partition(logits) + F.softplus(logits).sum(dim=-1)

    def log_counts(self, logits: Tensor) -> Tensor:
        """log Σ_{z ⊨ C, |z| = j} exp(logits·z) for j = kmin..kmax: [..., n] -> [..., J], where
        ``counts_by_size``; ValueError otherwise."""
        raise ValueError(
            f"{type(self).__name__} has no log-count by size in one pass (counts_by_size is False): "
            "evaluate one constraint per size"
        )

    def marginals(self, logits: Tensor, *, values: bool = True) -> Tensor:
        """P(x_i = 1 | constraint): [..., n] -> [..., n]. Its Jacobian is Cov(x) (exact).

        values=False skips the pass that computes the values and returns zeros that still carry the
        marginals' Jacobian in the backward: for straight-through estimators, which need only the
        gradient.
        """
        r, lead = self._inputs(logits)
        m, _ = self._marginals(r, None, values)
        return self._out(m, lead, logits)

    def sample(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Exact draws from P(x | constraint): [..., n] -> [..., n] in {0, 1}, the logits' dtype.

        generator: a ``torch.Generator`` on the evaluator's device, for reproducible draws.
        """
        r, lead = self._inputs(logits, generator)
        with torch.no_grad():
            z = self._sample(r, ops.seed(generator, r))
        return self._out(z, lead, logits)

    def map(self, logits: Tensor) -> Tensor:
        """The most probable satisfying assignment: [..., n] -> [..., n] in {0, 1}."""
        r, lead = self._inputs(logits)
        with torch.no_grad():
            z = self._map(r)
        return self._out(z, lead, logits)

    def marginals_and_sample(self, logits: Tensor, generator: torch.Generator | None = None, *, values: bool = True):
        """(marginals, one exact draw) from one pass; the marginals differentiable (and ``values``)
        as in ``marginals``: [..., n] -> ([..., n], [..., n])."""
        r, lead = self._inputs(logits, generator)
        m, z = self._marginals(r, ops.seed(generator, r), values)
        return self._out(m, lead, logits), self._out(z, lead, logits)

    def chosen_scores(
        self,
        logits: Tensor,
        generator: torch.Generator | None = None,
        *,
        slots: int,
        kind: str = "softmax",
        paper: bool = False,
    ):
        """One exact draw z and its variables by score π = softmax(logits) or sigmoid(logits)
        (``kind``), descending (ties to the lower index), in ``slots`` slots, weighted by Eq. 7's
        straight-through weights: π there, the gradient through π and the marginals (Jacobian Cov(z),
        or Cov(z) diag(1 - sigmoid(logits)) with ``paper``). One operator, ``circuits::chosen_scores``
        (one pass where the kernels fuse it: ``Kernels.fused``). logits [T, n] -> (weights
        [T, slots], indices [T, slots] long, mask [T, slots] bool, π [T, n] detached); unused slots
        hold the lowest undrawn variables, ascending, weight 0."""
        r, _ = self._inputs(logits, generator)
        if self.validate and r.shape[0]:
            self._check_chosen(r)
        return ops.chosen_scores_call(r, generator, self.kmin, self.kmax, self.handle, slots, kind, paper)
