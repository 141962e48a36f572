"""The patched router: a subclass of the family's own ``*TopKRouter``, made at run time.

The subclass shares the block's ``weight`` Parameter (the instance keeps it: only its class
changes), so checkpoint keys stay stock, and HF's router-logit hooks, matched with isinstance on
the family's router class, keep capturing ``router_logits``. Its forward computes the logits as
the stock router does (``F.linear`` in the hidden states' dtype; in float32 for DeepSeek-V3),
then routes by the plan's method (``probmoe.methods``; the gate asks the method object, never
its name):

    where the method routes by the stock router in this mode (``Method.stock``): the stock
        forward itself (bit for bit), or with a selection bias of ours the top-k of π + b
    otherwise: the method's rule (``Method.rule``) on the logits, given the family's own top-k
        choice where the method takes it (``Method.stock_choice``: DenseMixer, DefaultMoE), the
        router's state buffer and, for a method with penalties (ReMoE), the list they are
        collected into; the weights times the plan's scale (DeepSeek-V3's routed_scaling_factor)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import probmoe
from probmoe.methods import Gate
from probmoe.methods.topk import topk_rule
from probmoe.replay import GeneratorReplay, in_backward
from probmoe.router import router_logits
from probmoe.scores import dense_selection

from . import balance as balance_mod
from . import pickling, runtime_state
from .methods import Plan


@dataclass
class GateRecord:
    """What one router did in its last forward (detached; for statistics and the aux losses).

    indices: [T, kmax] long, the experts whose outputs enter the forward value, by slot;
    mask: [T, kmax] bool, the used slots (unused ones hold distinct unused experts at weight 0: the
        routing contract, docs/router.md);
    routing: the ``probmoe.Routing`` of the ProbMoE methods (it holds the autograd graph until the
        next forward), None for the stock methods.
    """

    indices: Tensor
    mask: Tensor
    num_experts: int
    routing: probmoe.Routing | None = None

    @property
    def selected(self) -> Tensor:
        """The used experts per token: [T, N] bool."""
        return dense_selection(self.indices, self.mask, self.num_experts)

    @property
    def counts(self) -> Tensor:
        """Tokens routed to each expert: [N] long."""
        out = torch.zeros(self.num_experts, dtype=torch.long, device=self.indices.device)
        return out.scatter_add_(0, self.indices.reshape(-1), self.mask.reshape(-1).long())

    @property
    def experts_per_token(self) -> Tensor:
        """[T] long."""
        return self.mask.sum(dim=-1)


class PatchedGate:
    """Mixin placed before the family's ``*TopKRouter`` in the run-time subclass.

    Instance attributes added by ``patch_model`` (removed by ``unpatch_model``): ``probmoe_plan``
    (the ``Plan``), ``probmoe_family``, ``probmoe_generator``, ``probmoe_replay`` and, after a
    forward, ``probmoe_last`` (a ``GateRecord``); for ReMoE ``probmoe_layers`` (L) and the
    buffer ``probmoe_remoe``.
    """

    ADDED = (
        "probmoe_plan",
        "probmoe_family",
        "probmoe_generator",
        "probmoe_replay",
        "probmoe_last",
        "probmoe_layers",
        "probmoe_penalties",
        "probmoe_collected",
    )  # ReMoE's penalties collected during a CausalLM forward
    # (model.py), and whether the last forward collected them (its checkpoint recomputation does the same)
    BUFFERS = ("probmoe_bias", "probmoe_load")  # the aux-free selection bias [N] (families without
    # e_score_correction_bias) and loads [N]; and the method's state (``Method.state_buffer``: ReMoE's
    # ``probmoe_remoe`` [λ, Σ sparsity, forwards]); float32, persistent (runtime_state)

    def forward(self, hidden_states: Tensor):
        logits, weights, indices = self.probmoe_route(hidden_states)
        if self.probmoe_plan.options.balance is not None and self.training and torch.is_grad_enabled():
            with torch.no_grad():
                self.probmoe_load.add_(self.probmoe_last.counts.float())  # tokens per expert, for after_step
        return logits, weights, indices

    def probmoe_route(self, hidden_states: Tensor):
        plan: Plan = self.probmoe_plan
        family, method = self.probmoe_family, plan.rules
        bias = balance_mod.selection_bias(self) if plan.options.balance is not None else None
        own_bias = bias is not None and not family.grouped  # DeepSeek-V3's stock router adds its own
        if method.stock(self.training):
            if own_bias:
                logits = router_logits(hidden_states, self.weight)
                weights, indices = topk_rule(logits, plan.top_k, plan.normalize, family.scores, bias)
                if not family.fp32_weights:
                    weights = weights.to(logits.dtype)
            else:
                logits, weights, indices = super().forward(hidden_states)  # the stock router, untouched
            self.probmoe_last = GateRecord(
                indices.detach(), torch.ones_like(indices, dtype=torch.bool), plan.num_experts
            )
            return logits, weights, indices
        stock_idx = None
        if method.stock_choice and family.grouped:  # the stock choice (groups, bias), the stock float32 logits
            logits, _, stock_idx = super().forward(hidden_states)
        else:
            logits = router_logits(
                hidden_states, self.weight, float32=family.fp32_logits
            )  # [T, N], as the stock router
            if method.stock_choice and own_bias:
                stock_idx = topk_rule(logits, plan.top_k, plan.normalize, family.scores, bias)[1]
        gate = Gate(
            top_k=plan.top_k,
            num_experts=plan.num_experts,
            normalize=plan.normalize,
            scores=family.scores,
            options=plan.options,
            routing=plan.routing,
            generator=self.probmoe_generator,
            replay=self.probmoe_replay,
            bias=None if method.stock_choice else bias,  # the top-k methods' bias chose stock_idx
            stock_indices=stock_idx,
            state=self._buffers.get(method.state_buffer) if method.state_buffer else None,
            layers=getattr(self, "probmoe_layers", 1),
            sink=self._penalty_sink() if method.penalizes else None,
        )
        out = method.rule(logits, gate, self.training)
        weights, indices = out.weights, out.indices
        self.probmoe_last = GateRecord(out.used, out.used_mask, plan.num_experts, out.routing)
        if plan.scale != 1.0:
            weights = weights * plan.scale  # DeepSeek-V3's routed_scaling_factor
        if not family.fp32_weights:
            weights = weights.to(logits.dtype)  # as the stock OLMoE/Qwen routers
        return logits, weights, indices

    def _penalty_sink(self) -> list | None:
        """Where this forward's penalties go: the list a CausalLM forward collects them in (model.py),
        or None (attached to the gates)."""
        sink = getattr(self, "probmoe_penalties", None)
        if not torch.compiler.is_compiling() and in_backward():  # a checkpoint recomputation: as the forward
            return [] if getattr(self, "probmoe_collected", False) else None  # it repeats (same saved tensors)
        # under reentrant checkpointing that forward ran without grad: the recomputation attaches
        self.probmoe_collected = sink is not None and torch.is_grad_enabled()
        return sink

    def __reduce_ex__(self, protocol):  # pickle, torch.save, deepcopy: the patched class (see pickling)
        return pickling.reduce(
            self, gate_class, (pickling.stock_class(self, PatchedGate),), ("probmoe_last", "probmoe_penalties")
        )


_CLASSES: dict[type, type] = {}


def gate_class(router_class: type) -> type:
    """The patched subclass of ``router_class`` (one per class, so isinstance and compile caches hold)."""
    if router_class not in _CLASSES:
        _CLASSES[router_class] = type(
            f"ProbMoE{router_class.__name__}", (PatchedGate, router_class), {"__module__": router_class.__module__}
        )
    return _CLASSES[router_class]


def install(gate, plan: Plan, family, generator, layers: int) -> None:
    """Patch ``gate`` (one of ``layers`` MoE layers) to route by ``plan``."""
    gate.__class__ = gate_class(type(gate))
    gate.probmoe_plan, gate.probmoe_family = plan, family
    gate.probmoe_generator, gate.probmoe_replay = generator, GeneratorReplay()
    gate.probmoe_last = None
    if plan.options.balance is not None:
        n, device = plan.num_experts, gate.weight.device
        if not family.grouped:
            gate.register_buffer("probmoe_bias", torch.zeros(n, dtype=torch.float32, device=device))
        gate.register_buffer("probmoe_load", torch.zeros(n, dtype=torch.float32, device=device))
    method = plan.rules
    if method.state_buffer is not None:
        gate.probmoe_layers = layers
        like = torch.empty(len(method.initial_state(plan.options)), dtype=torch.float32, device=gate.weight.device)
        gate.register_buffer(method.state_buffer, runtime_state.initial(gate, method.state_buffer, like))


def uninstall(gate) -> None:
    gate.__class__ = next(c for c in type(gate).__mro__[1:] if not issubclass(c, PatchedGate))
    state = gate.probmoe_plan.rules.state_buffer if "probmoe_plan" in gate.__dict__ else None
    for name in PatchedGate.ADDED:
        gate.__dict__.pop(name, None)
    for name in (*PatchedGate.BUFFERS, state):
        gate._buffers.pop(name, None)
