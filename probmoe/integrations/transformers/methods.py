"""The methods of the paper's comparison, and the validated plan a patched model routes by.

"conventional"      stock top-k routing (training and eval)
"frozen"            stock top-k routing, router weights frozen
"densemixer"        training: dense forward over all N experts (DenseMixer); eval: stock top-k
"probmoe"           ProbMoE Exact-k (training: sampled, Eq. 7; eval: MAP = stock top-k)
"probmoe-dynamic"   ProbMoE Dynamic-k over kmin..kmax (eval: MAP, clamp(#{r > 0}, kmin, kmax))
"sample-dense-ste", "topk-marginal"   the paper's two ablations (Exact-k; eval: MAP)
"probmoe-grouped"   (grouped families: DeepSeek-V3) ProbMoE on exactly k experts from at most
                    topk_group of the n_group expert groups, the model's own limit (eval: MAP)
"defaultmoe"        training: stock top-k forward, dense router gradient from the default
                    outputs (EMA) of the unselected experts (DefaultMoE); eval: stock top-k
"sparsemixer"       SparseMixer v2: Gumbel sampling within a jitter band, midpoint router
                    gradient (training); eval: its deterministic top-k (softmax families)
"remoe"             ReMoE: ReLU gates, adaptive L1 penalty steering the mean number of
                    active experts to k (training and eval; softmax families)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import circuits
import probmoe

from ..method_names import (  # noqa: F401 (their home; exported here)
    ALL_METHODS,
    BALANCES,
    BASELINES,
    EXACT_K,
    GROUPED_METHODS,
    METHODS,
    RANGE,
    STOCK,
    TOP_K,
    UNGROUPED,
)
from ..routing_options import RoutingOptions
from . import remoe as remoe_mod
from . import sparsemixer as sparsemixer_mod
from .families import GROUPED

BALANCE_RATE = 1e-3  # γ, DeepSeek-V3's bias update speed
_PROBMOE_METHOD = {
    "probmoe": "probmoe",
    "probmoe-dynamic": "probmoe",
    "sample-dense-ste": "sample-dense-ste",
    "topk-marginal": "topk-marginal",
    "probmoe-grouped": "probmoe",
}  # -> RoutingConfig.method


@dataclass(frozen=True)
class Plan:
    """How a patched model routes: everything ``patch_model`` was given, checked against the model.

    options: the ``RoutingOptions`` resolved: every default the method takes filled in (k, or
        kmin and kmax; aux_loss and z_loss as numbers, 0: off; ReMoE's l1_coef, l1_rate and
        l1_layers; SparseMixer's jitter_eps; balance_rate with balance), None where an option
        does not apply. ``patch_model(model, options=plan.options)`` makes the same plan.
    routing: the ``probmoe.RoutingConfig`` of the ProbMoE methods (None for the others).
    top_k: the model's own ``num_experts_per_tok``; num_experts: N.
    scale: the factor the used weights are multiplied by (DeepSeek-V3's ``routed_scaling_factor``).
    """

    options: RoutingOptions
    routing: probmoe.RoutingConfig | None
    num_experts: int
    top_k: int
    normalize: bool
    scale: float = 1.0

    @property
    def method(self) -> str:
        return self.options.method

    @property
    def kmax(self) -> int:
        """Slots per token handed to the experts."""
        return self.routing.kmax if self.routing is not None else self.top_k

    @property
    def dynamic(self) -> bool:
        """Tokens use different numbers of experts (unused slots are skipped by the experts)."""
        return self.routing is not None and not self.routing.exact_k

    @property
    def experts_kind(self) -> str | None:
        """The patched experts this plan needs (``experts.install``'s kind), or None: stock."""
        if self.method == "remoe":
            return "skip-weight"
        if self.method == "defaultmoe":
            return "default"
        return "skip" if self.dynamic else None


def _experts(name: str, value, n: int):
    if value is not None and value > n:
        raise ValueError(f"{name} must be in [1, {n}] (the model has {n} experts), got {value}")
    return value


def make_plan(config, family, method=None, *, options: RoutingOptions | None = None, **values) -> Plan:
    """Check the routing ``options`` (or ``method`` and the options' fields as keywords) against the
    model's ``config``; ValueError naming the option and the allowed values."""
    if method is not None:
        values["method"] = method
    options = RoutingOptions.given(options, **values)
    method = options.method
    if method is None:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in ALL_METHODS)}; got None")
    if method in GROUPED_METHODS and not family.grouped:
        raise ValueError(
            f"method {method!r} routes within the model's expert groups (n_group, topk_group); model "
            f"type {family.model_type!r} has none (it applies to {', '.join(GROUPED)})"
        )
    if method in UNGROUPED and family.grouped:
        raise ValueError(
            f"method {method!r} is not defined for model type {family.model_type!r}: it replaces the "
            "softmax top-k gate, and this family routes by sigmoid scores within expert groups "
            "(n_group, topk_group), which it has no form for"
        )
    n, top_k = family.num_experts(config), family.top_k(config)
    k, kmin, kmax = (_experts(name, getattr(options, name), n) for name in ("k", "kmin", "kmax"))
    normalize = family.normalize(config)
    routing = None
    if method in RANGE:
        kmin, kmax = circuits.checks.cardinality(
            n,
            kmin=1 if kmin is None else kmin,
            kmax=top_k if kmax is None else kmax,
            lowest=1,
            note=f" (N = {n} experts)",
        )
    elif method not in TOP_K:
        k = top_k if k is None else k
    if method not in TOP_K:
        constraint = None
        if method in GROUPED_METHODS:  # exactly k experts from at most topk_group of the n_group groups
            n_group, topk_group = family.groups(config)
            constraint = circuits.GroupLimited(n, k, n_group, topk_group)
        routing = probmoe.RoutingConfig(
            n,
            k=None if constraint is not None else k,
            kmin=kmin,
            kmax=kmax,
            method=_PROBMOE_METHOD[method],
            backend=options.backend,
            grad=options.grad,
            normalize=normalize,
            scores=family.scores,
            constraint=constraint,
        )
    remoe = method == "remoe"
    aux_default = 0.0 if remoe else getattr(config, "router_aux_loss_coef", 0.0) or 0.0  # ReMoE balances by its L1
    z_default = getattr(config, "router_z_loss_coef", 0.0) or 0.0

    def given_or(value, default):
        return float(default if value is None else value)

    resolved = replace(
        options,
        k=k,
        kmin=kmin,
        kmax=kmax,
        aux_loss=given_or(options.aux_loss, aux_default),
        z_loss=given_or(options.z_loss, z_default),
        l1_coef=given_or(options.l1_coef, remoe_mod.L1_COEF) if remoe else None,
        l1_rate=given_or(options.l1_rate, remoe_mod.L1_RATE) if remoe else None,
        l1_layers=(options.l1_layers or remoe_mod.LAYER_REDUCTIONS[0]) if remoe else None,
        jitter_eps=(given_or(options.jitter_eps, sparsemixer_mod.JITTER_EPS) if method == "sparsemixer" else None),
        balance_rate=given_or(options.balance_rate, BALANCE_RATE) if options.balance else None,
    )
    return Plan(resolved, routing, n, top_k, normalize, family.scale(config))
