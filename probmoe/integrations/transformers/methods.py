"""The validated plan a patched model routes by: ``make_plan`` checks the routing options against the
model (the method's declaration, ``probmoe.methods``, says what it takes) and resolves every default.

The methods themselves (what each does, its rules, options and state) are ``probmoe.methods``: one
module per method; ``probmoe.methods.methods()`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import circuits
import probmoe
from probmoe.methods import Method, get_method, methods
from probmoe.methods.balance import BALANCE_RATE

from ..method_names import (  # noqa: F401 (aliases kept: the built-in methods' names, exported here)
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
from .families import GROUPED


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
    def rules(self) -> Method:
        """The registered method object (its rules, experts, state and control)."""
        return get_method(self.options.method)

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
        return self.rules.experts


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
    if options.method is None:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in methods())}; got None")
    rules = get_method(options.method)
    method = rules.name
    if rules.groups == "only" and not family.grouped:
        raise ValueError(
            f"method {method!r} routes within the model's expert groups (n_group, topk_group); model "
            f"type {family.model_type!r} has none (it applies to {', '.join(GROUPED)})"
        )
    if rules.groups == "never" and family.grouped:
        raise ValueError(
            f"method {method!r} is not defined for model type {family.model_type!r}: it replaces the "
            "softmax top-k gate, and this family routes by sigmoid scores within expert groups "
            "(n_group, topk_group), which it has no form for"
        )
    n, top_k = family.num_experts(config), family.top_k(config)
    k, kmin, kmax = (_experts(name, getattr(options, name), n) for name in ("k", "kmin", "kmax"))
    normalize = family.normalize(config)
    routing = None
    if rules.sizes == "range":
        kmin, kmax = circuits.checks.cardinality(
            n,
            kmin=1 if kmin is None else kmin,
            kmax=top_k if kmax is None else kmax,
            lowest=1,
            note=f" (N = {n} experts)",
        )
    elif rules.sizes == "exact-k":
        k = top_k if k is None else k
    if rules.estimator is not None:
        constraint = None
        if rules.groups == "only":  # exactly k experts from at most topk_group of the n_group groups
            n_group, topk_group = family.groups(config)
            constraint = circuits.GroupLimited(n, k, n_group, topk_group)
        routing = probmoe.RoutingConfig(
            n,
            k=None if constraint is not None else k,
            kmin=kmin,
            kmax=kmax,
            estimator=rules.estimator,
            algorithm=options.backend,
            grad=options.grad,
            normalize=normalize,
            scores=family.scores,
            constraint=constraint,
        )
    aux_default = getattr(config, "router_aux_loss_coef", 0.0) or 0.0
    if rules.default_aux_loss is not None:
        aux_default = rules.default_aux_loss
    z_default = getattr(config, "router_z_loss_coef", 0.0) or 0.0

    def given_or(value, default):
        return float(default if value is None else value)

    own = {
        name: (default if getattr(options, name) is None else getattr(options, name))
        for name, default in rules.options.items()
    }  # the method's own options, their defaults filled in (the others stay None)
    for name, value in own.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            own[name] = float(value)
    resolved = replace(
        options,
        k=k,
        kmin=kmin,
        kmax=kmax,
        aux_loss=given_or(options.aux_loss, aux_default),
        z_loss=given_or(options.z_loss, z_default),
        **own,
        balance_rate=given_or(options.balance_rate, BALANCE_RATE) if options.balance else None,
    )
    return Plan(resolved, routing, n, top_k, normalize, family.scale(config))
