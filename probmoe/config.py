"""``RoutingConfig``: how a ProbMoE router routes, validated once.

One frozen value holds the choices ``route``, ``ProbMoERouter`` and the integrations share: the
number of experts, the subset sizes (exactly k, or kmin..kmax) or a structured ``constraint``
(any compiled circuit over the experts, e.g. ``circuits.GroupLimited``), the training
``estimator``, the exact ``algorithm``, the gradient convention, HF's ``norm_topk_prob`` and the
gate scores (softmax or sigmoid). (``method`` and ``backend``, their old names, still work with a
DeprecationWarning: ``probmoe.renamed``.) It is
checked when it is made, so the code that routes with it checks nothing again, and it round-trips
through a plain dict (``to_dict`` / ``from_dict``) for settings files written beside checkpoints:
``from_dict`` trusts nothing it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import circuits

from . import _validate, constraints
from .renamed import RENAMED, deprecated_attribute, new_words, quietly
from .scores import KINDS as SCORES  # ("softmax", "sigmoid")

ESTIMATORS = ("probmoe", "topk-marginal", "sample-dense-ste")
ALGORITHMS = circuits.ALGORITHMS  # ("circuit", "dp"): the compiled circuit or the cardinality DP
GRADS = ("exact", "paper")
METHODS = ESTIMATORS  # its old name (a deprecated alias, kept for its importers)
BACKENDS = ALGORITHMS  # its old name (a deprecated alias, kept for its importers)


@dataclass(frozen=True, init=False)
class RoutingConfig:
    """ProbMoE routing of tokens over ``num_experts`` experts.

    Args:
        num_experts: N >= 1.
        k: exactly k experts per token (Exact-k), 1 <= k <= N. Or give ``kmin`` and/or ``kmax``
            (Dynamic-k, 1 <= kmin <= kmax <= N; a missing kmin is 1, a missing kmax is N).
            After construction ``kmin`` and ``kmax`` are always set, and ``k`` is set exactly
            when they are equal.
        estimator: the training estimator: "probmoe" (sampled forward, marginal backward, Eq. 7),
            "topk-marginal" (MAP forward, marginal backward) or "sample-dense-ste" (sampled
            forward, softmax backward): the paper's method and its two ablations. (Old name:
            ``method``.)
        algorithm: "circuit" (the compiled circuit) or "dp" (the dynamic program); both exact.
            (Old name: ``backend``.)
        grad: "exact" (Jacobian of the marginals Cov(z)) or "paper" (Cov(z) diag(1 - p)).
        normalize: divide the used weights by their sum (HF's ``norm_topk_prob``).
        scores: the gate values the used experts are weighted by: "softmax" (softmax(r) over the
            N experts, as OLMoE, Qwen and Mixtral) or "sigmoid" (sigmoid(r) = the Bernoulli
            probabilities p, as DeepSeek-V3).
        constraint: None, or the allowed subsets as a compiled circuit over the N experts (a
            ``circuits.Circuit``) or a spec (``circuits.GroupLimited``, ``GroupCapacity``,
            ``SddFile``, ``CnfFile``; ``ExactlyK`` / ``RangeK`` are stored as k / kmin..kmax).
            ``kmin``/``kmax`` are then the smallest and largest allowed subset (k/kmin/kmax may be
            given only if they agree); every allowed subset needs at least 1 expert. Needs
            algorithm "circuit". ``to_dict`` can write GroupLimited / GroupCapacity specs only.
    """

    num_experts: int
    k: int | None = None
    kmin: int | None = None
    kmax: int | None = None
    # no class defaults for the two renamed words: dynamo before torch 2.13 builds a frozen
    # dataclass by passing its fields' defaults as keywords, which would read as both words given
    # (``__init__`` defaults them: None means "not given")
    estimator: str
    algorithm: str
    grad: str = "exact"
    normalize: bool = False
    scores: str = "softmax"
    constraint: object = None

    method = deprecated_attribute("method")
    backend = deprecated_attribute("backend")

    def __init__(
        self,
        num_experts: int,
        k: int | None = None,
        kmin: int | None = None,
        kmax: int | None = None,
        estimator: str | None = None,
        algorithm: str | None = None,
        grad: str = "exact",
        normalize: bool = False,
        scores: str = "softmax",
        constraint: object = None,
        **old,
    ):
        words, names = new_words({"estimator": estimator, "algorithm": algorithm}, old)
        estimator = ESTIMATORS[0] if words["estimator"] is None else words["estimator"]
        algorithm = ALGORITHMS[0] if words["algorithm"] is None else words["algorithm"]
        n = _validate.int_in("num_experts", num_experts, 1, 2**31)
        if k is not None and kmin == kmax == k:  # an already resolved exactly-k config (to_dict)
            kmin = kmax = None
        if constraint is not None:
            constraint, kmin, kmax = constraints.settle(constraint, n, algorithm, k, kmin, kmax, lowest=1)
            k = None
        kmin, kmax = _validate.cardinality(n, k, kmin, kmax, lowest=1)
        _validate.choice(names["estimator"], estimator, ESTIMATORS)  # named as the caller named it
        _validate.choice(names["algorithm"], algorithm, ALGORITHMS)
        _validate.choice("grad", grad, GRADS)
        _validate.choice("scores", scores, SCORES)
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be True or False, got {normalize!r}")
        for name, value in (
            ("num_experts", n),
            ("k", kmin if kmin == kmax else None),
            ("kmin", kmin),
            ("kmax", kmax),
            ("estimator", estimator),
            ("algorithm", algorithm),
            ("grad", grad),
            ("normalize", normalize),
            ("scores", scores),
            ("constraint", constraint),
        ):
            object.__setattr__(self, name, value)

    @property
    def exact_k(self) -> bool:
        """Every token uses the same number of experts (kmin == kmax)."""
        return self.kmin == self.kmax

    def describe(self) -> str:
        """``k=8``, ``kmin=4, kmax=8`` or ``constraint=GroupLimited(...)``, for reprs and logs."""
        if self.constraint is not None:
            return f"constraint={constraints.describe(self.constraint)}"
        return f"k={self.k}" if self.exact_k else f"kmin={self.kmin}, kmax={self.kmax}"

    def to_dict(self) -> dict:
        """A JSON-able dict that ``from_dict`` turns back into an equal config (ValueError for a
        constraint that has no dict form: a compiled circuit or a file spec)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["constraint"] = constraints.to_dict(self.constraint)
        return data

    @classmethod
    def resolve(cls, num_experts: int, config: RoutingConfig | None = None, **fields) -> RoutingConfig:
        """``config`` checked against ``num_experts``, or, when it is None, the config the keyword
        ``fields`` describe (those given as None take their defaults; ``method`` and ``backend``, the
        old names, with a DeprecationWarning). Passing both is an error."""
        given = {name: value for name, value in fields.items() if value is not None}
        if config is None:
            return cls(num_experts, **given)
        if not isinstance(config, cls):
            raise ValueError(f"config must be a probmoe.RoutingConfig or None, got {type(config).__name__}")
        if given:
            raise ValueError(f"pass either config or its fields ({', '.join(sorted(given))}), not both")
        if config.num_experts != num_experts:
            raise ValueError(f"config.num_experts = {config.num_experts}, but there are {num_experts} experts")
        return config

    @classmethod
    def from_dict(cls, data) -> RoutingConfig:
        """The config a ``to_dict`` dict describes (e.g. read from disk; the old keys ``method`` and
        ``backend`` are read as ``estimator`` and ``algorithm``); ValueError for anything else: not
        a dict, unknown or missing keys, or values out of range."""
        if not isinstance(data, dict):
            raise ValueError(f"a routing config must be a dict, got {type(data).__name__}")
        fields = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - fields - set(RENAMED))
        if unknown:
            raise ValueError(f"unknown routing config keys {unknown}; known: {sorted(fields)}")
        if "num_experts" not in data:
            raise ValueError("a routing config needs num_experts")
        return quietly(cls, {**data, "constraint": constraints.from_dict(data.get("constraint"))})
