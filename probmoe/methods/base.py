"""``Method``: what a routing method declares, and what its rules are given and return.

A method is one object (one module under ``probmoe/methods``, registered by name): its options and
their defaults, which sizes it takes, its training rule and its inference rule on the router logits,
the experts computation it needs, and any per-step state and control. The integrations
(transformers, vLLM, torchtitan, Megatron) ask the method object; none compares method names.

    train_rule(logits [T, N], gate) -> Routed      a training forward (may draw, may keep state)
    infer_rule(logits [T, N], gate) -> Routed      inference: plain torch, static shapes, no host
                                                   sync (vLLM captures it in a CUDA graph)
    rule(logits, gate, training) -> Routed         what a training framework's router calls in
                                                   either mode (default: one of the two above)

``Gate`` carries everything else a rule may read (k, normalisation, scores, the method's resolved
options, the selection bias, the generator, the per-router state); a rule reads what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

SIZES = ("top-k", "exact-k", "range")  # the model's own top-k; exactly k (k); kmin..kmax (kmin, kmax)
GROUPS = ("any", "only", "never")  # families with expert groups (DeepSeek-V3): allowed, required, refused
EXPERTS = (None, "skip", "skip-weight", "default")  # the patched experts a method needs (None: the stock)


@dataclass
class Gate:
    """What a rule is given besides the logits (one router, one forward).

    top_k: the model's own top-k; num_experts: N; normalize: renormalise the used weights;
    scores: "softmax" or "sigmoid" (the gate scores π); options: the method's resolved options
    (an object with the options as attributes: ``RoutingOptions``); routing: the
    ``probmoe.RoutingConfig`` of the ProbMoE methods (None for the others); k, kmin: the slots and
    the fewest used ones of an inference rule (serving); generator, replay: the draws of a
    training rule (``probmoe.replay``); bias: the selection bias b [N] float32 (aux-free
    balancing) or None; stock_indices: [T, top_k] the experts the family's own router chose (for
    methods with ``stock_choice``; None: the top-k of π); state: the router's state buffer
    (``Method.state_buffer``); layers: the MoE layers of the model; sink: a list a training rule
    appends its loss terms to (``Method.penalizes``), or None.
    """

    top_k: int
    num_experts: int
    normalize: bool = False
    scores: str = "softmax"
    options: object = None
    routing: object = None
    k: int | None = None
    kmin: int | None = None
    generator: torch.Generator | None = None
    replay: object = None
    bias: Tensor | None = None
    stock_indices: Tensor | None = None
    state: Tensor | None = None
    layers: int = 1
    sink: list | None = None


@dataclass
class Routed:
    """A rule's result.

    weights: [T, S] float32 the experts are mixed with (exactly 0 on unused slots); indices: [T, S]
    long, distinct experts per row (S: k, kmax or N); used, used_mask: the experts the token used
    ([T, U] long and [T, U] bool; default: indices and weights != 0 as a mask of all slots);
    routing: the ``probmoe.Routing`` of the ProbMoE methods, else None.
    """

    weights: Tensor
    indices: Tensor
    used: Tensor | None = None
    used_mask: Tensor | None = None
    routing: object = None

    def __post_init__(self):
        if self.used is None:
            self.used = self.indices
        if self.used_mask is None:
            self.used_mask = torch.ones_like(self.used, dtype=torch.bool)


@dataclass(frozen=True)
class Serving:
    """How a method is served (vLLM): ``kind`` "topk" (the top-k of π(r) + b, weights π(r): the
    stock rule without a bias) or the method's own ``infer_rule`` ("own"); ``slots`` the width handed
    to the fused experts; ``kmin`` the fewest used slots; ``normalizes``: the family's
    renormalisation applies."""

    kind: str
    slots: int
    kmin: int
    normalizes: bool = True


class Method:
    """A routing method (see the module docstring). Subclass it, set the class attributes, write
    the rules, and ``register_method`` an instance.

    name: the method's one name (settings files, flags, ``patch_model``).
    summary: one line for listings and docs.
    sizes: "top-k" (routes to the model's own top-k), "exact-k" (takes k) or "range" (kmin, kmax).
    estimator: the ``probmoe.RoutingConfig`` estimator of the ProbMoE methods; None for the others
        (a method with an estimator is routed by ``probmoe.route``, with a ``RoutingConfig``).
    groups: with expert groups (DeepSeek-V3): "any", "only" (the method routes within them), or
        "never" (no form for them).
    balances: aux-free balancing (a selection bias) applies.
    options: {option: default} of the method's own options (fields of ``RoutingOptions``).
    experts: the patched experts it needs (``EXPERTS``), None for the stock experts.
    stock_choice: its training rule takes the experts the family's own router chose
        (``Gate.stock_indices``).
    trains_router: False freezes the router weights.
    penalizes: its training rule appends loss terms to ``Gate.sink`` (they ride on the loss).
    state_buffer: the name of a per-router float32 buffer (``initial_state``), None without state.
    default_aux_loss: None: the model config's ``router_aux_loss_coef``; a number: this instead.
    dense_training: training runs every expert on every token (the memory estimate).
    """

    name: str = ""
    summary: str = ""
    sizes: str = "top-k"
    estimator: str | None = None
    groups: str = "any"
    balances: bool = True
    options = MappingProxyType({})
    experts: str | None = None
    stock_choice: bool = False
    trains_router: bool = True
    penalizes: bool = False
    state_buffer: str | None = None
    default_aux_loss: float | None = None
    dense_training: bool = False

    def stock(self, training: bool) -> bool:
        """The family's own router routes in this mode (bit for bit; a selection bias added to its
        scores where the family has none of its own)."""
        return False

    def train_rule(self, logits: Tensor, gate: Gate) -> Routed:
        raise NotImplementedError(f"method {self.name!r} has no training rule")

    def infer_rule(self, logits: Tensor, gate: Gate) -> Routed:
        raise NotImplementedError(f"method {self.name!r} has no inference rule")

    def rule(self, logits: Tensor, gate: Gate, training: bool) -> Routed:
        return self.train_rule(logits, gate) if training else self.infer_rule(logits, gate)

    def serving(self, routing, top_k: int, num_experts: int, biased: bool) -> Serving | None:
        """How a checkpoint of this method is served (None: no static-shape form, not served)."""
        return Serving("topk", top_k, top_k)

    def initial_state(self, options) -> list[float]:
        """The values ``state_buffer`` starts from."""
        return []

    def after_step(self, states: list[Tensor], *, top_k: int, num_experts: int, options) -> dict:
        """The per-step control, after an optimizer step, on every router's state: the statistics
        it reports ({name: number}; {} when nothing ran)."""
        return {}

    def experts_per_token(self, num_experts: int, k: int, kmax: int) -> int:
        """Experts each token runs through in training (the memory estimate)."""
        if self.dense_training:
            return num_experts
        return kmax if self.sizes == "range" else k

    def describe(self, routing, top_k: int) -> str:
        """The routing a model runs, for logs: ``probmoe-dynamic (kmin=1, kmax=2)``."""
        return f"{self.name} ({routing.describe()})" if routing is not None else f"{self.name} (top-{top_k})"

    def legacy_options(self, values: dict, given: dict) -> dict:
        """The options of a version 1 or 2 settings file (``given``: its "options"), read as they
        were written: ``values`` with what the method's old files meant added."""
        return values

    def __repr__(self) -> str:
        return f"<routing method {self.name!r}>"
