"""The patched router: a subclass of the family's own ``*TopKRouter``, made at run time.

The subclass shares the block's ``weight`` Parameter (the instance keeps it: only its class
changes), so checkpoint keys stay stock, and HF's router-logit hooks, matched with isinstance on
the family's router class, keep capturing ``router_logits``. Its forward computes the logits as
the stock router does (``F.linear`` in the hidden states' dtype; in float32 for DeepSeek-V3),
then routes by the plan:

    stock methods, and DenseMixer and DefaultMoE in eval: the stock forward itself (bit for bit)
    DenseMixer in training: all N experts, weights (mask·g).detach() + g − g.detach()
    DefaultMoE in training: the same weights, the top-k slots first (``defaultmoe``)
    SparseMixer: ``sparsemixer.sparsemixer_weights`` (training: sampled; eval: deterministic)
    ReMoE: all N experts weighted by ReLU(r), the L1 penalty attached (``remoe``)
    ProbMoE methods: ``probmoe.route`` (training: sampled, Eq. 7; eval: MAP), the weights times
        the plan's scale (DeepSeek-V3's routed_scaling_factor)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

import probmoe
from probmoe.replay import GeneratorReplay, in_backward
from probmoe.router import routed, router_logits
from probmoe.scores import dense_selection

from . import balance as balance_mod
from . import pickling, runtime_state
from .defaultmoe import defaultmoe_weights
from .densemixer import densemixer_weights
from .methods import STOCK, Plan
from .remoe import remoe_gates
from .sparsemixer import sparsemixer_weights


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
    BUFFERS = ("probmoe_remoe", "probmoe_bias", "probmoe_load")  # ReMoE's [λ, Σ sparsity, forwards]; the
    # aux-free selection bias [N] (families without e_score_correction_bias) and loads [N]; float32, persistent
    # (runtime_state)

    def forward(self, hidden_states: Tensor):
        logits, weights, indices = self.probmoe_route(hidden_states)
        if self.probmoe_plan.options.balance is not None and self.training and torch.is_grad_enabled():
            with torch.no_grad():
                self.probmoe_load.add_(self.probmoe_last.counts.float())  # tokens per expert, for after_step
        return logits, weights, indices

    def probmoe_route(self, hidden_states: Tensor):
        plan: Plan = self.probmoe_plan
        family = self.probmoe_family
        bias = balance_mod.selection_bias(self) if plan.options.balance is not None else None
        own_bias = bias is not None and not family.grouped  # DeepSeek-V3's stock router adds its own
        dense_in_training = plan.method in ("densemixer", "defaultmoe")
        if plan.method in STOCK + ("defaultmoe",) and not (dense_in_training and self.training):
            if own_bias:
                logits = router_logits(hidden_states, self.weight)
                weights, indices = balance_mod.biased_topk(logits, plan.top_k, plan.normalize, family.scores, bias)
                if not family.fp32_weights:
                    weights = weights.to(logits.dtype)
            else:
                logits, weights, indices = super().forward(hidden_states)  # the stock router, untouched
            self.probmoe_last = GateRecord(
                indices.detach(), torch.ones_like(indices, dtype=torch.bool), plan.num_experts
            )
            return logits, weights, indices
        if plan.method in ("densemixer", "defaultmoe"):
            stock_idx = None
            if family.grouped:  # the stock choice (groups, bias) and the stock float32 logits
                logits, _, stock_idx = super().forward(hidden_states)
            else:
                logits = router_logits(hidden_states, self.weight)
                if own_bias:
                    stock_idx = balance_mod.biased_topk(logits, plan.top_k, plan.normalize, family.scores, bias)[1]
            make = densemixer_weights if plan.method == "densemixer" else defaultmoe_weights
            weights, indices, top_idx = make(
                logits, plan.top_k, plan.normalize, scores=family.scores, top_idx=stock_idx
            )
            self.probmoe_last = GateRecord(
                top_idx.detach(), torch.ones_like(top_idx, dtype=torch.bool), plan.num_experts
            )
        elif plan.method == "sparsemixer":
            logits = router_logits(hidden_states, self.weight)  # [T, N]
            weights, indices = sparsemixer_weights(
                logits,
                plan.top_k,
                training=self.training,
                jitter_eps=plan.options.jitter_eps,
                generator=self.probmoe_generator,
            )  # [T, k] each
            self.probmoe_last = GateRecord(indices, torch.ones_like(indices, dtype=torch.bool), plan.num_experts)
        elif plan.method == "remoe":
            logits = router_logits(hidden_states, self.weight)  # [T, N]
            scale = 1.0 if plan.options.l1_layers == "sum" else 1.0 / self.probmoe_layers  # λ per layer, or λ/L
            sink = getattr(self, "probmoe_penalties", None)  # set while a CausalLM forward collects (model.py)
            if not torch.compiler.is_compiling() and in_backward():  # a checkpoint recomputation: as the forward
                sink = [] if getattr(self, "probmoe_collected", False) else None  # it repeats (same saved tensors)
            else:  # under reentrant checkpointing that forward ran without grad: the recomputation attaches
                self.probmoe_collected = sink is not None and torch.is_grad_enabled()
            weights = remoe_gates(
                logits, plan.top_k, self.probmoe_remoe, scale, training=self.training, sink=sink
            )  # [T, N]
            indices = torch.arange(plan.num_experts, device=logits.device).expand_as(weights)  # [T, N]
            self.probmoe_last = GateRecord(indices, weights.detach() > 0, plan.num_experts)
        else:
            logits = router_logits(
                hidden_states, self.weight, float32=family.fp32_logits
            )  # [T, N], as the stock router
            if bias is None:
                routing = routed(
                    logits,
                    plan.routing,
                    training=self.training,
                    generator=self.probmoe_generator,
                    replay=self.probmoe_replay,
                    validate_args=False,
                )  # as the stock router: no host sync
                weights = routing.weights  # [T, kmax]
            else:  # the subsets of the shifted logits, the weights of the unbiased scores (balance)
                shifted = logits.float() + bias
                routing = routed(
                    shifted,
                    dataclasses.replace(plan.routing, normalize=False),
                    training=self.training,
                    generator=self.probmoe_generator,
                    replay=self.probmoe_replay,
                    validate_args=False,
                )
                weights = balance_mod.probmoe_weights(routing, logits, shifted, family.scores, plan.normalize)
            indices = routing.indices  # [T, kmax]
            self.probmoe_last = GateRecord(indices.detach(), routing.mask, plan.num_experts, routing)
        if plan.scale != 1.0:
            weights = weights * plan.scale  # DeepSeek-V3's routed_scaling_factor
        if not family.fp32_weights:
            weights = weights.to(logits.dtype)  # as the stock OLMoE/Qwen routers
        return logits, weights, indices

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
    if plan.method == "remoe":
        gate.probmoe_layers = layers
        like = torch.empty(3, dtype=torch.float32, device=gate.weight.device)
        gate.register_buffer("probmoe_remoe", runtime_state.initial(gate, "probmoe_remoe", like))


def uninstall(gate) -> None:
    gate.__class__ = next(c for c in type(gate).__mro__[1:] if not issubclass(c, PatchedGate))
    for name in PatchedGate.ADDED:
        gate.__dict__.pop(name, None)
    for name in PatchedGate.BUFFERS:
        gate._buffers.pop(name, None)
