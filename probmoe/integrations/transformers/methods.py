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

import math
from dataclasses import dataclass

import circuits
import probmoe

from ..method_names import ALL_METHODS, GROUPED_METHODS, METHODS  # noqa: F401 (their home; exported here)
from . import remoe as remoe_mod
from . import sparsemixer as sparsemixer_mod
from .families import GROUPED

STOCK = ("conventional", "frozen", "densemixer")  # routed by the family's own top-k (DenseMixer: in eval)
BASELINES = ("defaultmoe", "sparsemixer", "remoe")  # the other baselines of the paper's Table 1
TOP_K = STOCK + BASELINES  # methods that take the model's own top-k (no k, kmin, kmax, backend, grad)
RANGE = ("probmoe-dynamic",)  # methods that take kmin and kmax (a range of experts per token)
EXACT_K = tuple(m for m in ALL_METHODS if m not in TOP_K + RANGE)  # methods that take k (exactly k experts)
UNGROUPED = ("sparsemixer", "remoe")  # defined for softmax gates without group limits only
BALANCES = ("aux-free",)  # DeepSeek-V3's auxiliary-loss-free balancing (``balance``)
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
    """How a patched model routes: everything ``patch_model`` was given, checked.

    method: one of ``METHODS``.
    routing: the ``probmoe.RoutingConfig`` of the ProbMoE methods (None for the stock ones).
    top_k: the model's own ``num_experts_per_tok``; num_experts: N.
    aux_loss, z_loss: coefficients of the load-balancing loss and the router z-loss.
    scale: the factor the used weights are multiplied by (DeepSeek-V3's ``routed_scaling_factor``).
    l1_coef, l1_rate: ReMoE's initial L1 coefficient λ₀ and its factor α per step (0 otherwise).
    l1_layers: ReMoE's penalty over the L layers: "sum" (λ per layer, the official code) or
        "mean" (λ/L, the paper's formula); "" for the other methods.
    jitter_eps: SparseMixer's band half-width ε (0 for the other methods).
    balance, balance_rate: "aux-free" (a per-expert selection bias updated after each step by
        ``balance_rate`` γ: ``balance``) or None.
    """

    method: str
    routing: probmoe.RoutingConfig | None
    num_experts: int
    top_k: int
    normalize: bool
    aux_loss: float
    z_loss: float
    scale: float = 1.0
    l1_coef: float = 0.0
    l1_rate: float = 0.0
    balance: str | None = None
    balance_rate: float = 0.0
    l1_layers: str = ""
    jitter_eps: float = 0.0

    @property
    def kmax(self) -> int:
        """Slots per token handed to the experts."""
        return self.routing.kmax if self.routing is not None else self.top_k

    @property
    def dynamic(self) -> bool:
        """Tokens use different numbers of experts (unused slots are skipped by the experts)."""
        return self.routing is not None and not self.routing.exact_k

    @property
    def options(self) -> dict:
        """The method-specific ``patch_model`` keywords this plan was made with (settings file)."""
        out = (
            {"l1_coef": self.l1_coef, "l1_rate": self.l1_rate, "l1_layers": self.l1_layers}
            if self.method == "remoe"
            else {}
        )
        if self.method == "sparsemixer":
            out["jitter_eps"] = self.jitter_eps
        if self.balance is not None:
            out.update(balance=self.balance, balance_rate=self.balance_rate)
        return out

    @property
    def experts_kind(self) -> str | None:
        """The patched experts this plan needs (``experts.install``'s kind), or None: stock."""
        if self.method == "remoe":
            return "skip-weight"
        if self.method == "defaultmoe":
            return "default"
        return "skip" if self.dynamic else None


def _int_or_none(name: str, value, lo: int, hi: int):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}] or None, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}] (the model has {hi} experts), got {value}")
    return value


def _coefficient(name: str, value, default: float) -> float:
    if value is ...:
        return float(default)
    if value is None or value is False:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{name} must be a finite number >= 0 (0 or None: off; ...: the config's coefficient), got {value!r}"
        )
    return float(value)


def _positive(name: str, value, default: float, lo_open: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= lo_open:
        raise ValueError(f"{name} must be a finite number > {lo_open:g}, got {value!r}")
    return float(value)


def make_plan(
    config,
    family,
    method,
    *,
    k=None,
    kmin=None,
    kmax=None,
    backend="circuit",
    grad="exact",
    aux_loss=...,
    z_loss=...,
    l1_coef=None,
    l1_rate=None,
    l1_layers=None,
    balance=None,
    balance_rate=None,
    jitter_eps=None,
) -> Plan:
    """Check ``patch_model``'s arguments against the model's ``config``; ValueError naming the
    argument and the allowed values."""
    if method not in ALL_METHODS:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in ALL_METHODS)}; got {method!r}")
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
    if method != "remoe" and (l1_coef is not None or l1_rate is not None or l1_layers is not None):
        raise ValueError(f"l1_coef, l1_rate and l1_layers apply only to method 'remoe', not to {method!r}")
    if l1_layers is not None and l1_layers not in remoe_mod.LAYER_REDUCTIONS:
        raise ValueError(
            f"l1_layers must be one of {', '.join(repr(r) for r in remoe_mod.LAYER_REDUCTIONS)} (λ per "
            f"layer as the official code, or λ/L as the paper's formula), got {l1_layers!r}"
        )
    if method != "sparsemixer" and jitter_eps is not None:
        raise ValueError(f"jitter_eps applies only to method 'sparsemixer', not to {method!r}")
    if balance is not None and balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES} or None, got {balance!r}")
    if balance is None and balance_rate is not None:
        raise ValueError("balance_rate applies only with balance='aux-free'")
    if balance is not None and method in UNGROUPED:
        raise ValueError(
            f"balance: method {method!r} has no top-k selection to bias (ReMoE balances by its L1 "
            "penalty); it applies to the other methods"
        )
    n, top_k = family.num_experts(config), family.top_k(config)
    k = _int_or_none("k", k, 1, n)
    kmin = _int_or_none("kmin", kmin, 1, n)
    kmax = _int_or_none("kmax", kmax, 1, n)
    if backend not in probmoe.config.BACKENDS:
        raise ValueError(f"backend must be one of {probmoe.config.BACKENDS}; got {backend!r}")
    if grad not in probmoe.config.GRADS:
        raise ValueError(f"grad must be one of {probmoe.config.GRADS}; got {grad!r}")
    normalize = family.normalize(config)
    routing = None
    if method in TOP_K:
        for name, value, takers in (("k", k, EXACT_K), ("kmin", kmin, RANGE), ("kmax", kmax, RANGE)):
            if value is not None:
                raise ValueError(
                    f"{name} applies only to the method{'s' if len(takers) > 1 else ''} "
                    f"{', '.join(takers)}; method {method!r} routes to the model's own top-{top_k}"
                )
        if (backend, grad) != ("circuit", "exact"):
            raise ValueError(f"backend and grad apply only to the ProbMoE methods, not to {method!r}")
    elif method == "probmoe-dynamic":
        if k is not None:
            raise ValueError("k: method 'probmoe-dynamic' takes kmin and kmax (use method 'probmoe' for exactly k)")
        kmin, kmax = circuits.checks.cardinality(
            n,
            kmin=1 if kmin is None else kmin,
            kmax=top_k if kmax is None else kmax,
            lowest=1,
            note=f" (N = {n} experts)",
        )
    else:
        if kmin is not None or kmax is not None:
            raise ValueError(
                f"kmin/kmax: method {method!r} routes exactly k experts (give k); "
                "use method 'probmoe-dynamic' for a range"
            )
        kmin = kmax = top_k if k is None else k
    if method not in TOP_K:
        constraint = None
        if method in GROUPED_METHODS:  # exactly k experts from at most topk_group of the n_group groups
            n_group, topk_group = family.groups(config)
            constraint = circuits.GroupLimited(n, kmin, n_group, topk_group)
            kmin = kmax = None
        routing = probmoe.RoutingConfig(
            n,
            kmin=kmin,
            kmax=kmax,
            method=_PROBMOE_METHOD[method],
            backend=backend,
            grad=grad,
            normalize=normalize,
            scores=family.scores,
            constraint=constraint,
        )
    remoe = method == "remoe"
    aux_default = 0.0 if remoe else getattr(config, "router_aux_loss_coef", 0.0) or 0.0  # ReMoE balances by its L1
    return Plan(
        method,
        routing,
        n,
        top_k,
        normalize,
        _coefficient("aux_loss", aux_loss, aux_default),
        _coefficient("z_loss", z_loss, getattr(config, "router_z_loss_coef", 0.0) or 0.0),
        family.scale(config),
        _positive("l1_coef", l1_coef, remoe_mod.L1_COEF, 0.0) if remoe else 0.0,
        _positive("l1_rate", l1_rate, remoe_mod.L1_RATE, 1.0) if remoe else 0.0,
        balance,
        _positive("balance_rate", balance_rate, BALANCE_RATE, 0.0) if balance else 0.0,
        (l1_layers or remoe_mod.LAYER_REDUCTIONS[0]) if remoe else "",
        _positive("jitter_eps", jitter_eps, sparsemixer_mod.JITTER_EPS, 0.0) if method == "sparsemixer" else 0.0,
    )
