"""``route``: ProbMoE routing of T tokens over N experts, Exact-k, Dynamic-k or any compiled
constraint, training and eval.

Training draws S ~ P(S | C) and weights the drawn experts with the straight-through estimator of
the paper's Eq. 7, w = (stopgrad(z - m) + m) ⊙ π, gathered at the drawn experts, π the gate
scores (softmax(r), or sigmoid(r) for sigmoid gates): the forward value is exactly π there, the
backward goes through the marginals m (Jacobian Cov(z), Eq. 8) and through π. Eval takes the MAP
subset (``circuits.map_size`` / ``map_mask``; for a structured constraint, the circuit's MAP).

A training route with the sampled methods' marginal gradient ("probmoe") over sizes, where the
distribution's kernels fuse it (the C kernels: float32 logits on the CPU), is one registered
operator forward and one backward (``SubsetDistribution.chosen_scores``: the draw, the drawn experts
by score, the weights and their gradient, saving the logits, int32 indices and the mask);
everywhere else route composes the same computation from the distribution's operators
(``_select``, ``_weights``), with the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from circuits import map_size

from . import _validate
from . import constraints as subset_constraints
from .config import RoutingConfig
from .distribution import SubsetDistribution
from .gate_weights import gate_weights
from .scores import dense_selection, gate_scores, normalized


@dataclass
class Routing:
    """The routing of T tokens: ``kmax`` slots per token, the first ``counts`` of them used.

    indices: [T, kmax] long, the used slots in descending softmax probability (ties of
        underflowed probabilities in descending logit for a range at eval). The routing contract
        (docs/router.md): no row repeats an expert; unused slots hold experts the token does not
        use (after a draw or a circuit's MAP the lowest-numbered ones, ascending; after a range's
        MAP the next ones by logit), with weight exactly 0.
    weights: [T, kmax]; exactly 0, with no gradient, on unused slots.
    mask: [T, kmax] bool, the used slots.
    probs: [T, N] the gate scores π: softmax(logits), or sigmoid(logits) (``config.scores``);
        detached (the weights carry the gradient).
    distribution: the ``SubsetDistribution`` the subsets come from; ``marginals`` is its mean.
    config: the ``RoutingConfig`` the tokens were routed with.
    """

    indices: Tensor
    weights: Tensor
    mask: Tensor
    probs: Tensor
    distribution: SubsetDistribution
    config: RoutingConfig

    @property
    def marginals(self) -> Tensor:
        """P(i ∈ S) [T, N], differentiable; computed on first use (the training estimator needs only
        their gradient, so routing itself never computes their values)."""
        return self.distribution.mean

    @property
    def counts(self) -> Tensor:
        """Experts used per token: [T] long."""
        return self.mask.sum(dim=-1)

    def selected(self) -> Tensor:
        """The used experts as a dense mask: [T, N] bool."""
        return dense_selection(self.indices, self.mask, self.probs.shape[-1])


def route(
    logits: Tensor,
    config: RoutingConfig | None = None,
    *,
    training: bool,
    k=None,
    kmin=None,
    kmax=None,
    constraint=None,
    estimator: str | None = None,
    generator: torch.Generator | None = None,
    normalize: bool | None = None,
    algorithm: str | None = None,
    grad: str | None = None,
    scores: str | None = None,
    validate_args=None,
    method: str | None = None,
    backend: str | None = None,
) -> Routing:
    """Route tokens with ProbMoE. logits: [T, N] router logits (-inf: never route there).

    config: a ``RoutingConfig`` with N = ``num_experts``; or give its fields as keywords (k or
        kmin/kmax or constraint, estimator, normalize, algorithm, grad, scores; the defaults are
        ``RoutingConfig``'s):
    k: exactly k experts per token (Exact-k); or kmin/kmax: between kmin and kmax (Dynamic-k),
        1 <= kmin <= kmax <= N (a missing kmin is 1, a missing kmax is N).
    constraint: instead of sizes, the allowed subsets: a ``circuits.Circuit`` over N variables or
        a spec such as ``circuits.GroupLimited(N, k, groups, max_groups)`` (``RoutingConfig``).
        The Routing's slots are then its largest subset (kmax).
    training: True draws S from the distribution; False takes the MAP subset: the top-k experts
        (identical to softmax + topk, so experts whose probabilities underflow to 0 tie; with
        sigmoid scores, top-k of sigmoid(r)) or, for a range, the top clamp(#{logits > 0}, kmin,
        kmax) logits; for a structured constraint the circuit's MAP, the allowed subset with the
        largest sum of logits (top-k is not the MAP there).
    estimator (training only): "probmoe" (sampled forward, marginal backward, Eq. 7), or the
        paper's ablations on the same code path: "topk-marginal" (MAP forward, marginal
        backward) and "sample-dense-ste" (sampled forward; backward with z ≈ softmax(r), the
        classic straight-through estimator, in place of z ≈ m).
    normalize: divide the used weights by their sum (HF's ``norm_topk_prob``), after the
        straight-through estimator, so the gradient goes through numerator and denominator.
    scores: the gate scores π the used experts are weighted by: "softmax" or "sigmoid".
    algorithm, grad: as for ``SubsetDistribution`` (a constraint other than a group spec needs
        "circuit").
    generator (training only): a ``torch.Generator`` on the logits' device, for reproducible draws;
        or a seed tensor (0-dim int64), of whose value alone the draw is a function: what compiled
        code passes, as no Generator can enter a torch.compile graph
        (``probmoe.integrations.scale_out.compiled_seed``); None: torch's default generator.
    method, backend: the old names of estimator and algorithm (a DeprecationWarning).
    validate_args: check the logit values (one host synchronisation on the CPU; on CUDA
        assertions in the graph, no host synchronisation), as for ``SubsetDistribution``.
        float16/bfloat16 logits are routed in float32.
    """
    logits = _validate.logits_tensor(logits, dim=2)
    config = RoutingConfig.resolve(
        logits.shape[-1],
        config,
        k=k,
        kmin=kmin,
        kmax=kmax,
        constraint=constraint,
        normalize=normalize,
        grad=grad,
        scores=scores,
        estimator=estimator,
        algorithm=algorithm,
        method=method,
        backend=backend,
    )
    if not isinstance(training, bool):
        raise ValueError(f"training must be True or False, got {training!r}")
    _validate.generator(generator, logits.device)
    r = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    dist = SubsetDistribution._checked(r, config, validate_args)  # the logits were checked above
    if training and _fused(dist, r, config):
        return _route_fused(dist, r, config, generator)
    with torch.no_grad():  # the weights carry the gradient (gate_weights); probs is for selection and users
        probs = gate_scores(r, config.scores)  # [T, N]
    tangent, idx, mask = _select(dist, r, probs, config, training, generator)
    w = _weights(r, tangent, idx, mask, probs, config)
    return Routing(idx, w, mask, probs, dist, config)


def _fused(dist: SubsetDistribution, r: Tensor, config: RoutingConfig) -> bool:
    """Whether a training route is one operator, ``circuits::chosen_scores`` (the draw, the drawn
    experts by score, Eq. 7's weights; its backward a second one): for the sampled methods with the
    marginals' gradient ("probmoe"), sizes or a group spec, and kernels of the backend that fuse it
    for the logits' dtype and device (``circuits.native_kernels``: the fused C DP or C circuit
    passes, float32 on the CPU; the DP's Triton lattice kernels, the group DP's Triton kernels or
    the circuit's Triton passes, float32 on CUDA). Elsewhere (other constraints, the torch sweeps
    and passes) route composes the same computation from the distribution's operators
    (``_select``, ``_weights``)."""
    if config.estimator != "probmoe":
        return False
    if config.constraint is not None:
        return subset_constraints.native_constraint(config.constraint, config.algorithm, r.dtype, r.device)
    return subset_constraints.native_cardinality(
        r.shape[-1], config.kmin, config.kmax, config.algorithm, r.dtype, r.device
    )


def _route_fused(dist: SubsetDistribution, r: Tensor, config: RoutingConfig, generator) -> Routing:
    """``route(training=True)`` as one ``circuits::chosen_scores`` call (same draws, indices, weights
    and gradients as the composed path), then the normalisation if asked."""
    w, idx, mask, probs = dist.chosen_scores(config.scores, generator)
    if config.normalize:
        w = normalized(w)
    return Routing(idx, w, mask, probs, dist, config)


def _select(
    dist: SubsetDistribution, r: Tensor, probs: Tensor, config: RoutingConfig, training: bool, generator
) -> tuple[Tensor | None, Tensor, Tensor]:
    """The used experts and what carries the backward: (tangent, idx, mask).

    tangent: zeros [T, N] whose Jacobian is the straight-through estimator's (z ≈ m, or z ≈ π for
        "sample-dense-ste"), None when no gradient can flow (the marginals are then skipped);
    idx: [T, kmax] long, the used experts first, by descending score (ties to the lower index);
    mask: [T, kmax] bool, the used slots.
    """
    estimator, kmin, kmax = config.estimator, config.kmin, config.kmax
    sampled = training and estimator != "topk-marginal"
    marginal_st = training and estimator != "sample-dense-ste" and torch.is_grad_enabled() and r.requires_grad
    if sampled or config.constraint is not None:
        if sampled:
            tangent, z = dist.mean_tangent(True, generator) if marginal_st else (None, dist.sample(generator=generator))
        else:  # the circuit's MAP
            tangent, z = (dist.mean_tangent()[0] if marginal_st else None), dist.mode
        top, idx = torch.ops.circuits.topk_chosen(z, probs, kmax)  # [T, kmax]: the chosen by probability, then -1
        mask = top >= 0
    else:
        tangent = dist.mean_tangent()[0] if marginal_st else None
        # exactly-k: softmax + topk as HF does (never a -inf logit; probabilities that underflow to 0
        # tie); a range: the MAP's top logits, which do not tie there
        key = torch.where(r > -torch.inf, probs, -1.0) if kmin == kmax else r.detach()
        _, idx = key.topk(kmax, dim=-1)  # [T, kmax], as stock softmax + topk
        mask = torch.arange(kmax, device=r.device) < map_size(r, kmin, kmax).unsqueeze(-1)
    if training and estimator == "sample-dense-ste":
        scores = gate_scores(r, config.scores)  # [T, N]
        tangent = scores - scores.detach()
    return tangent, idx, mask


def _weights(
    r: Tensor, tangent: Tensor | None, idx: Tensor, mask: Tensor, probs: Tensor, config: RoutingConfig
) -> Tensor:
    """Eq. 7 at the used slots (value π, gradient through the tangent), normalised if the config
    says so: [T, kmax], exactly 0 on unused slots."""
    w = gate_weights(r, tangent, idx, mask, config.scores, probs)
    return normalized(w) if config.normalize else w
