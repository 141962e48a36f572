"""``ProbMoERouter``: ProbMoE routing as a torchtitan ``TokenChoiceTopKRouter`` (torchtitan 0.3.0).

Its ``Config`` is the stock router's with the ProbMoE fields added, so ``MoE.Config(router=...)``
builds it and every existing field keeps its meaning:

    top_k               kmax, the slots per token (Exact-k: exactly top_k experts)
    kmin                None: Exact-k; 1 <= kmin <= top_k: Dynamic-k, between kmin and top_k experts
    score_func          the gate scores π the used experts are weighted by: "softmax" or "sigmoid"
    route_norm          divide the used weights by their sum (after the straight-through estimator)
    route_scale         multiply the weights (DeepSeek-V3's routed scaling factor)
    num_expert_groups,  group-limited routing: subsets from at most num_limited_groups of the
    num_limited_groups  num_expert_groups contiguous groups (``circuits.GroupLimited``; an exact
                        constraint on P(S), where the stock router picks groups by their top-2 scores)
    estimator, algorithm, grad   as ``probmoe.RoutingConfig`` (``method``, ``backend``: the old
                        names of estimator and algorithm, with a DeprecationWarning)
    seed                None: draws from torch's default generator; an int: from a generator seeded
                        per rank (``scale_out.rank_generator``), so draws repeat run to run and differ
                        across data-parallel ranks

forward(x [..., D], expert_bias_E [E] or None) -> (weights [..., K], expert ids [..., K], scores
[..., E]): the stock router's outputs and shapes (torchtitan 0.3.0 passes x as (B, L, D)). The
gate logits r are float32. Training draws S ~ P(S | C, r + b) (b the aux-free expert bias MoE
passes in, added to the logits that define P(S), as the stock router adds it to the scores it picks
by), eval takes the MAP subset; the weights are the unbiased scores π(r) at the used experts with
Eq. 7's straight-through gradient. Ids and weights follow the routing contract (docs/router.md):
no row repeats an expert; a Dynamic-k token's unused slots hold experts it does not use, with
weight exactly 0. The scores output is π(r), detached (torchtitan's MoE reads only its shape).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torchtitan.models.common.moe import TokenChoiceTopKRouter

import circuits
import probmoe
from probmoe.integrations.scale_out import compiled_seed, rank_generator
from probmoe.methods import Gate
from probmoe.methods.probmoe import route_probmoe
from probmoe.replay import GeneratorReplay
from probmoe.scores import gate_scores


class ProbMoERouter(TokenChoiceTopKRouter):
    """A ``TokenChoiceTopKRouter`` that routes by ProbMoE (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(TokenChoiceTopKRouter.Config):
        kmin: int | None = None
        estimator: str | None = None  # None: "probmoe"
        algorithm: str | None = None  # None: "circuit"
        grad: str = "exact"
        seed: int | None = None
        method: str | None = None  # deprecated: estimator
        backend: str | None = None  # deprecated: algorithm

        def __post_init__(self):
            routing_config(self)  # bad values fail when the model config is made, not at build

    def __init__(self, config: Config):
        super().__init__(config)
        self.routing = routing_config(config)
        self.seed = config.seed
        self._generator: torch.Generator | None = None
        self._replay = GeneratorReplay()
        self.last_routing: probmoe.Routing | None = None

    @property
    def generator(self) -> torch.Generator | None:
        """The per-rank generator (made on first use, when the rank and the device are known)."""
        if self.seed is not None and self._generator is None:
            self._generator = rank_generator(self.seed, self.gate.weight.device)
        return self._generator

    def _draws(self, logits: Tensor) -> torch.Generator | Tensor | None:
        """What a training forward draws from: the per-rank generator eagerly, a seed tensor under
        torch.compile (``scale_out.compiled_seed``), the default generator without a seed."""
        if self.seed is None:
            return None
        if torch.compiler.is_compiling():
            return compiled_seed(logits, self.seed)
        return self.generator

    def forward(self, x: Tensor, expert_bias_E: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        lead, E = x.shape[:-1], self.num_experts
        logits = self._logits(x).reshape(-1, E)  # [..., D] -> [T, E] float32
        generator = self._draws(logits) if self.training else None
        gate = Gate(
            top_k=self.routing.kmax,
            num_experts=E,
            normalize=self.routing.normalize,
            scores=self.score_func,
            routing=self.routing,
            generator=generator,
            replay=self._replay,
            bias=expert_bias_E,
        )  # P(S) from the logits shifted by the bias, the weights from the unbiased scores
        routing, w = route_probmoe(logits, gate, self.training)  # [T, K]
        self.last_routing = routing
        if self.route_scale != 1.0:
            w = w * self.route_scale
        K = w.shape[-1]
        scores = gate_scores(logits.detach(), self.score_func) if expert_bias_E is not None else routing.probs
        return w.view(*lead, K), routing.indices.view(*lead, K), scores.view(*lead, E)

    def _logits(self, x: Tensor) -> Tensor:
        """The gate's logits in float32, as the stock router makes them (autocast to float32 on an
        accelerator; CPU autocast has no float32, where the stock router warns and computes in x's
        dtype, and so does this one): [..., D] -> [..., E]."""
        if x.device.type == "cpu":
            return self.gate(x).float()
        with torch.autocast(device_type=x.device.type, dtype=torch.float32):
            return self.gate(x).float()


def routing_config(config: ProbMoERouter.Config) -> probmoe.RoutingConfig:
    """The ``probmoe.RoutingConfig`` of a router config; ValueError naming the field otherwise."""
    E, kmax = config.num_experts, config.top_k
    if not isinstance(E, int) or E < 1:
        raise ValueError(f"num_experts must be an int >= 1, got {E!r}")
    if not isinstance(kmax, int) or not 1 <= kmax <= E:
        raise ValueError(f"top_k (kmax, the slots per token) must be in 1..num_experts = {E}, got {kmax!r}")
    kmin = kmax if config.kmin is None else config.kmin
    if not isinstance(kmin, int) or not 1 <= kmin <= kmax:
        raise ValueError(f"kmin must be in 1..top_k = {kmax} (or None for exactly top_k), got {config.kmin!r}")
    if config.score_func not in ("softmax", "sigmoid"):
        raise ValueError(f"score_func must be 'softmax' or 'sigmoid', got {config.score_func!r}")
    if config._debug_force_load_balance:
        raise ValueError("_debug_force_load_balance replaces the routing by round robin: not with ProbMoE")
    if config.seed is not None and (not isinstance(config.seed, int) or config.seed < 0):
        raise ValueError(f"seed must be None or an int >= 0, got {config.seed!r}")
    words = dict(estimator=config.estimator, algorithm=config.algorithm, method=config.method, backend=config.backend)
    fields = dict(
        **{name: value for name, value in words.items() if value is not None},  # the old words: RoutingConfig's
        grad=config.grad,
        normalize=config.route_norm,
        scores=config.score_func,
    )
    groups, limited = config.num_expert_groups, config.num_limited_groups
    if groups is None:
        if limited is not None:
            raise ValueError(f"num_limited_groups ({limited}) needs num_expert_groups")
        return probmoe.RoutingConfig(E, kmin=kmin, kmax=kmax, **fields)
    if not isinstance(groups, int) or groups < 1 or E % groups:
        raise ValueError(f"num_expert_groups must be an int >= 1 dividing num_experts = {E}, got {groups!r}")
    if not isinstance(limited, int) or not 1 <= limited <= groups:
        raise ValueError(f"num_limited_groups must be in 1..num_expert_groups = {groups}, got {limited!r}")
    if kmax > limited * (E // groups):
        raise ValueError(f"top_k = {kmax} experts do not fit in num_limited_groups = {limited} groups of {E // groups}")
    spec = circuits.GroupLimited(E, None, groups, limited, kmin=kmin, kmax=kmax)
    return probmoe.RoutingConfig(E, constraint=spec, **{**fields, "backend": None, "algorithm": "circuit"})
