"""``SubsetDistribution``: independent Bernoulli(sigmoid(logits)) conditioned on |S| ∈ [kmin, kmax],
or on any constraint compiled as a circuit (``probmoe.constraints``).

    P(S | C) ∝ Π_{i∈S} p_i Π_{i∉S} (1 - p_i) ∝ exp(Σ_{i∈S} r_i),   C: kmin <= |S| <= kmax, or S ∈ C

A ``torch.distributions.Distribution`` over binary masks [..., N] (event shape [N]); see
docs/distribution.md for the mathematics and the two gradient conventions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.distributions import Distribution, constraints

import circuits

from . import _validate
from . import constraints as subset_constraints
from .config import ALGORITHMS, GRADS, RoutingConfig
from .renamed import deprecated_attribute, new_words


class Subsets(constraints.Constraint):
    """Binary vectors whose number of ones is in [kmin, kmax]."""

    is_discrete = True
    event_dim = 1

    def __init__(self, kmin: int, kmax: int):
        self.kmin, self.kmax = kmin, kmax
        super().__init__()

    def check(self, value: Tensor) -> Tensor:
        binary = ((value == 0) | (value == 1)).all(dim=-1)
        size = value.sum(dim=-1)
        return binary & (size >= self.kmin) & (size <= self.kmax)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kmin={self.kmin}, kmax={self.kmax})"


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


def _sample_shape(sample_shape) -> torch.Size:
    """``sample_shape`` as a torch.Size of non-negative integers, else ValueError."""
    try:
        shape = torch.Size(sample_shape)
    except TypeError:
        raise ValueError(f"sample_shape must be a sequence of non-negative integers, got {sample_shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"sample_shape must be a sequence of non-negative integers, got {tuple(shape)}")
    return shape


class SubsetDistribution(Distribution):
    """Subsets S of N experts with P(S) ∝ exp(Σ_{i∈S} logits_i), exactly k or kmin..kmax of them.

    Args:
        logits: [..., N] log-odds r; -inf means "never in S". float16/bfloat16 are computed in
            float32; results come back in the logits' dtype.
        k: exactly k experts (0 <= k <= N). Or give ``kmin`` and/or ``kmax`` (defaults 0 and N).
        constraint: instead of k / kmin / kmax, the allowed subsets as a compiled circuit over the
            N experts (``circuits.Circuit``) or a spec (``circuits.GroupLimited``,
            ``GroupCapacity``, ...; see ``probmoe.constraints``). ``kmin``/``kmax`` are then its
            smallest and largest subsets; the mode is the circuit's MAP. Algorithm "circuit", or
            "dp" for the group specs.
        algorithm: "circuit" (the compiled circuit from ``circuits``) or "dp" (a dynamic program, no
            compilation: ``circuits.CardinalityDP`` for sizes, ``circuits.GroupDP`` for
            ``GroupLimited`` and ``GroupCapacity``): the two algorithms of
            ``circuits.engine`` (``circuits.ALGORITHMS``). Both are exact. (Old name: ``backend``,
            with a DeprecationWarning.)
        grad: the Jacobian of ``.mean`` w.r.t. the logits. "exact": Cov(z). "paper": Cov(z)
            diag(1 - p), the convention of the official ProbMoE code and SIMPLE. Everything else
            (log_partition, log_prob, entropy, cardinality_probs) is differentiated exactly.
        validate_args: check the logit values (NaN, +inf, |logits| >= 1e20, a range that -inf
            logits make infeasible) and ``log_prob``'s argument: on the CPU with one host
            synchronisation, on CUDA as assertions in the graph with none (a failure is then a
            device-side assert at the next synchronisation: docs/distribution.md). Default:
            ``torch.distributions.Distribution``'s global default.

    Shapes: batch_shape = logits.shape[:-1], event_shape = [N].
    """

    arg_constraints = {"logits": constraints.real_vector}
    has_rsample = False

    def __init__(
        self,
        logits: Tensor,
        k=None,
        *,
        kmin=None,
        kmax=None,
        constraint=None,
        algorithm: str | None = None,
        grad: str = "exact",
        validate_args=None,
        backend: str | None = None,
    ):
        words, names = new_words({"algorithm": algorithm}, {"backend": backend})
        logits = _validate.logits_tensor(logits)
        algorithm = ALGORITHMS[0] if words["algorithm"] is None else words["algorithm"]
        algorithm = _validate.choice(names["algorithm"], algorithm, ALGORITHMS)
        if constraint is not None:
            constraint, kmin, kmax = subset_constraints.settle(constraint, logits.shape[-1], algorithm, k, kmin, kmax)
            k = None
        kmin, kmax = _validate.cardinality(logits.shape[-1], k, kmin, kmax)
        self._setup(logits, kmin, kmax, algorithm, _validate.choice("grad", grad, GRADS), validate_args, constraint)

    @classmethod
    def from_config(cls, logits: Tensor, config: RoutingConfig, validate_args=None) -> SubsetDistribution:
        """The distribution a router with ``config`` draws from (its sizes or constraint, algorithm and grad).

        logits: [..., N] with N = ``config.num_experts``; the config was validated when it was
        made, so only the logits are checked here.
        """
        logits = _validate.logits_tensor(logits)
        if logits.shape[-1] != config.num_experts:
            raise ValueError(
                f"logits have N = {logits.shape[-1]} experts but config.num_experts = {config.num_experts}"
            )
        return cls._checked(logits, config, validate_args)

    @classmethod
    def _checked(cls, logits: Tensor, config: RoutingConfig, validate_args) -> SubsetDistribution:
        """``from_config`` for a caller that has checked the logits against the config (``route``)."""
        self = cls.__new__(cls)
        self._setup(logits, config.kmin, config.kmax, config.algorithm, config.grad, validate_args, config.constraint)
        return self

    def _setup(
        self, logits: Tensor, kmin: int, kmax: int, algorithm: str, grad: str, validate_args, constraint=None
    ) -> None:
        """Initialise from checked arguments (``constraint`` resolved by ``probmoe.constraints``); the
        logit values are checked here (``validate_args``)."""
        n = logits.shape[-1]
        self.logits, self.kmin, self.kmax, self.grad, self.constraint = logits, kmin, kmax, grad, constraint
        self._algorithm = algorithm
        if constraint is None:  # a circuit or the DP, the same queries either way
            self._engine = subset_constraints.cardinality(n, kmin, kmax, logits.device, algorithm)
        else:
            self._engine = subset_constraints.compiled(constraint, logits.device, algorithm)
        super().__init__(logits.shape[:-1], logits.shape[-1:], validate_args=False)
        self._validate_args = Distribution._validate_args if validate_args is None else bool(validate_args)
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        self._r = (logits if logits.dim() == 2 else logits.reshape(-1, n)).to(dtype)  # [T, N], T = prod(batch_shape)
        if self._validate_args and _validate.logits_values(logits, kmin) and constraint is not None:
            self._engine.check_satisfiable(self._r)  # only when some logit is -inf
        self._cache: dict[str, Tensor] = {}

    # --- helpers ------------------------------------------------------------------------------
    @property
    def algorithm(self) -> str:
        """ "circuit" or "dp"."""
        return self._algorithm

    backend = deprecated_attribute("backend")

    @property
    def k(self) -> int | None:
        """k for an exactly-k distribution, else None."""
        return self.kmin if self.kmin == self.kmax else None

    def _out(self, x: Tensor, *event: int) -> Tensor:
        """[T, *event] -> [*batch_shape, *event] in the logits' dtype."""
        return x.reshape(self.batch_shape + event).to(self.logits.dtype)

    def _cached(self, name: str, compute) -> Tensor:
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    def _marginals(self, paper: bool) -> Tensor:
        """[T, N], differentiable with the chosen convention; cached."""
        return self._cached(f"m{paper}", lambda: self._engine_marginals(paper)[0])

    def _engine_marginals(self, paper: bool, sample: bool = False, generator=None, values: bool = True):
        """(m [T, N], one draw [T, N] or None) from the engine, with the Jacobian Cov(z) (exact) or
        Cov(z) diag(1 - sigmoid(r)) (``paper``); the backward keeps only O(T N) tensors. With
        ``values=False`` m is zeros that carry that Jacobian."""
        r = PaperGrad.apply(self._r) if paper else self._r
        if sample:
            return self._engine.marginals_and_sample(r, generator, values=values)
        return self._engine.marginals(r, values=values), None

    def _log_counts(self) -> Tensor:
        """log Σ_{|S| = j, S ∈ C} exp(r·z_S), j = kmin..kmax: [T, J] (natural form). The DP has all sizes
        from one sweep; a circuit takes one circuit per size, its paper form plus Σ softplus(r)."""
        if self._engine.counts_by_size:
            return self._engine.log_counts(self._r)
        sizes = [self._size(j) for j in range(self.kmin, self.kmax + 1)]
        paper = torch.stack([c.log_partition(self._r) for c in sizes], dim=-1)  # [T, J]
        return paper + softplus_sum(self._r).unsqueeze(-1)

    def _size(self, j: int):
        """The circuit of the subsets of exactly j experts (that the constraint allows)."""
        if self.constraint is None:
            return subset_constraints.cardinality(self.event_shape[0], j, j, self.logits.device)
        if self.kmin == self.kmax:
            return self._engine
        if not hasattr(self.constraint, "with_cardinality"):
            raise ValueError(
                f"cardinality_probs needs a constraint spec with a size range (GroupLimited, "
                f"GroupCapacity); {subset_constraints.describe(self.constraint)} allows "
                f"{self.kmin}..{self.kmax} experts and cannot be split by size"
            )
        return subset_constraints.compiled(self.constraint.with_cardinality(j, j), self.logits.device, self._algorithm)

    # --- torch.distributions interface ---------------------------------------------------------
    @property
    def support(self) -> constraints.Constraint:
        if self.constraint is not None:
            return subset_constraints.Allowed(self._engine, subset_constraints.describe(self.constraint))
        return Subsets(self.kmin, self.kmax)

    @property
    def mean(self) -> Tensor:
        """Marginals P(i ∈ S): [..., N]. Jacobian: Cov(z) ("exact") or Cov(z) diag(1 - p) ("paper")."""
        return self._out(self._marginals(self.grad == "paper"), self.event_shape[0])

    @property
    def variance(self) -> Tensor:
        """Var(z_i) = m_i (1 - m_i): [..., N]."""
        m = self.mean
        return m * (1 - m)

    @property
    def mode(self) -> Tensor:
        """The most probable subset (``circuits.map_mask`` for sizes, the circuit's MAP for a
        structured constraint): [..., N] in {0, 1}."""
        with torch.no_grad():
            return self._out(self._engine.map(self._r), self.event_shape[0])

    def sample(self, sample_shape=(), generator: torch.Generator | None = None) -> Tensor:
        """Exact draws: [*sample_shape, *batch_shape, N] in {0, 1}, not differentiable.

        generator: a ``torch.Generator`` on the logits' device, for reproducible draws.
        """
        shape = _sample_shape(sample_shape)
        _validate.generator(generator, self.logits.device)
        with torch.no_grad():  # S draws per token: the rows repeated S times, [S, T, N]
            z = self._engine.sample(self._r.expand(math.prod(shape), *self._r.shape), generator)
        return z.reshape(shape + self.batch_shape + self.event_shape).to(self.logits.dtype)

    def mean_and_sample(self, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(``.mean``, one draw like ``.sample()``), sharing one pass of the backend when possible."""
        _validate.generator(generator, self.logits.device)
        paper = self.grad == "paper"
        if f"m{paper}" in self._cache:
            return self.mean, self.sample(generator=generator)
        m, z = self._engine_marginals(paper, sample=True, generator=generator)
        self._cache[f"m{paper}"] = m
        return self.mean, self._out(z.detach(), self.event_shape[0])

    def chosen_scores(self, scores: str = "softmax", generator: torch.Generator | None = None):
        """One draw S ~ P(S | C) and its experts by score π (``scores``: softmax(logits) or
        sigmoid(logits)), descending (ties to the lower index), in ``kmax`` slots, weighted by the
        paper's Eq. 7: π there, the gradient through π and through ``.mean`` (Jacobian Cov(z), or
        Cov(z) diag(1 - p) with grad "paper"). One operator (``circuits::chosen_scores``, one pass
        where the backend has fused kernels): (weights [..., kmax], indices [..., kmax] long, mask
        [..., kmax] bool, π [..., N] detached); unused slots hold the lowest undrawn experts,
        ascending, weight 0.

        generator: a ``torch.Generator`` on the logits' device (the draw is ``mean_and_sample``'s
        from the same generator state)."""
        _validate.generator(generator, self.logits.device)
        w, idx, mask, p = self._engine.chosen_scores(
            self._r, generator, slots=self.kmax, kind=scores, paper=self.grad == "paper"
        )
        if w.shape[:-1] != self.batch_shape:  # [T, ...] -> the batch shape (no view node for [T, N] logits)
            slots = self.batch_shape + (self.kmax,)
            w, idx, mask, p = (
                w.reshape(slots),
                idx.reshape(slots),
                mask.reshape(slots),
                p.reshape(self.batch_shape + self.event_shape),
            )
        dtype = self.logits.dtype
        return w.to(dtype), idx, mask, p.to(dtype)

    def mean_tangent(self, sample: bool = False, generator: torch.Generator | None = None):
        """(t, one draw or None): t is zeros [..., N] whose Jacobian is that of ``.mean``.

        For straight-through estimators (the paper's Eq. 7): ``x + t`` has x's value and
        ``.mean``'s gradient. The circuit backend then skips the pass that computes the marginals'
        values. With ``sample`` the draw comes from the same pass, like ``mean_and_sample``.
        """
        _validate.generator(generator, self.logits.device)
        t, z = self._engine_marginals(self.grad == "paper", sample=sample, generator=generator, values=False)
        n = self.event_shape[0]
        return self._out(t, n), None if z is None else self._out(z.detach(), n)

    @property
    def log_partition(self) -> Tensor:
        """log P_indep(|S| ∈ C) = log Σ_{S∈C} Π_{i∈S} p_i Π_{i∉S} (1 - p_i): [...] (paper form)."""
        return self._out(self._cached("logz", lambda: self._engine.log_partition(self._r)))

    def _log_normalizer(self) -> Tensor:
        """log Σ_{S∈C} exp(r·z_S): [T] (natural form)."""
        return self._cached("lognorm", lambda: self._engine.log_normalizer(self._r))  # the DP's: no cancellation

    @property
    def cardinality_probs(self) -> Tensor:
        """P(|S| = j | C) for j = kmin..kmax: [..., kmax - kmin + 1]."""
        probs = self._cached("sizes", lambda: torch.softmax(self._log_counts(), dim=-1))
        return self._out(probs, self.kmax - self.kmin + 1)

    def log_prob(self, value: Tensor) -> Tensor:
        """log P(S = value | C): [*sample, *batch, N] -> [*sample, *batch]; -inf outside the support."""
        if self._validate_args:
            self._validate_sample(value)
        r = self._r.reshape(*self.batch_shape, -1)
        score = torch.where(value > 0, r, torch.zeros_like(r)).sum(dim=-1)  # Σ_{i∈S} r_i
        lp = score - self._log_normalizer().reshape(self.batch_shape)
        lp = torch.where(self.support.check(value), lp, -torch.inf)
        return lp.to(self.logits.dtype)

    def _validate_sample(self, value: Tensor) -> None:
        """``log_prob``'s argument check: torch's (the shapes, then the values in the support: one
        host synchronisation), but on CUDA the values' check is an assertion in the graph, as for the
        logits (``circuits.checks.in_graph``)."""
        if not isinstance(value, Tensor) or not circuits.checks.in_graph(value):
            return super()._validate_sample(value)
        want = self.batch_shape + self.event_shape
        broadcasts = all(a == b or 1 in (a, b) for a, b in zip(value.shape[::-1], want[::-1]))
        if value.shape[-1:] != self.event_shape or not broadcasts:
            raise ValueError(f"value must have a shape that broadcasts with {list(want)}, got {list(value.shape)}")
        circuits.checks.require(self.support.check(value).all(), f"value must be within the support {self.support!r}")

    def entropy(self) -> Tensor:
        """H = log Σ_S exp(r·z_S) - Σ_i r_i m_i: [...]; its gradient is -Cov(z) r (always exact)."""
        m = self._marginals(False)
        r = torch.where(self._r > -torch.inf, self._r, 0.0)  # -inf logits have m = 0; keep 0 * -inf out
        return self._out(self._log_normalizer() - (r * m).sum(dim=-1))

    def expand(self, batch_shape, _instance=None):
        n = self.event_shape[0]
        logits = self.logits.expand(*batch_shape, n)
        sizes = {"kmin": self.kmin, "kmax": self.kmax} if self.constraint is None else {"constraint": self.constraint}
        return SubsetDistribution(logits, **sizes, algorithm=self.algorithm, grad=self.grad, validate_args=False)

    def __repr__(self) -> str:
        size = f"k={self.kmin}" if self.k is not None else f"kmin={self.kmin}, kmax={self.kmax}"
        if self.constraint is not None:
            size = f"constraint={subset_constraints.describe(self.constraint)}"
        return (
            f"SubsetDistribution(batch_shape={tuple(self.batch_shape)}, N={self.event_shape[0]}, {size}, "
            f"algorithm={self.algorithm!r}, grad={self.grad!r})"
        )
