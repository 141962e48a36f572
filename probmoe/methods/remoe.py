""" "remoe": ReMoE (Wang et al., ICLR 2025): ReLU routing with an adaptive, load-balanced L1 penalty.

Written from the official code (thu-ml/ReMoE, Megatron-LM based: ``router.py``'s ``ReLURouter``,
``moe_utils.py``'s ``switch_load_balancing_loss_func`` and ``MoEAuxLossAutoScaler``,
``schedules.py``'s loss scale, ``training.py``'s λ update):

    gates R = ReLU(r)  [T, N]: expert i runs on token t iff R_{t,i} > 0, weighted by R_{t,i}
        (no top-k, no softmax, no renormalisation; training and eval alike)
    penalty of one layer: λ · N / (k T²) · Σ_i c_i Σ_t R_{t,i},  c_i = #{t : R_{t,i} > 0} (constant)
        (``switch_load_balancing_loss_func`` on the ReLU outputs, λ per layer as ``router.py``
        applies it: ``l1_layers="sum"``, the default; ``"mean"``: λ/L per layer, L the MoE
        layers, the paper's formula, which averages the layers' terms)
    after each optimizer step: λ ← λ · α if S < Q, else λ / α (``training.py``: at S = Q too),
        Q = 1 − k / N the target sparsity and S the mean fraction of zero gates over the layers
        and forwards of the step; λ₀ = 1e-8 and α = 1.2 are the paper's and the official defaults

The penalty is a loss term whose value is left out of the loss, as Megatron's
``MoEAuxLossAutoScaler`` does. Megatron scales its gradient by loss_scale / num_microbatches
(``schedules.py``), the factor its loss gets; here the penalty takes whatever factor the loss
gets, by riding on the loss itself: the patched ``*ForCausalLM`` forward, when it computes a
loss (labels given, training, grad enabled), collects the layers' penalties and attaches their
sum to the loss (``attach``: value unchanged, gradient 1 · ∂(Σ penalties)), so gradient
accumulation's 1/G, a ``GradScaler``'s scale, DDP's and FSDP's averaging reach it as they reach
the loss. Where the loss is normalised by ``num_items_in_batch`` (the Trainer's gradient
accumulation), each micro-batch's penalties are weighted by its share of those label tokens, as
its loss is. Without such a forward (no labels; a trainer that replaces the model's forward, as
trl's SFTTrainer does) the penalty is attached to the gates with gradient scale 1 (Megatron's
default scale), which no loss scale reaches.

λ and the sparsity counters live in each router's buffer ``probmoe_remoe`` = [λ, Σ sparsity,
forwards], and ``ReMoE.after_step`` applies the update (the transformers integration's ``controls.after_step``;
``RoutingControlCallback`` calls it in a Trainer).
"""

from __future__ import annotations

from types import MappingProxyType

import torch
from torch import Tensor

from .base import Gate, Method, Routed, Serving
from .registry import register_method

L1_COEF = 1e-8  # λ₀
L1_RATE = 1.2  # α
L1_LAYERS = ("sum", "mean")  # λ per layer (official code), λ/L per layer (the paper's formula)
LAYER_REDUCTIONS = L1_LAYERS


class _AttachPenalty(torch.autograd.Function):
    """Forward: ``gates`` unchanged; backward: also the gradient of ``penalty`` (scale 1:
    ``MoEAuxLossAutoScaler`` at its default scale)."""

    @staticmethod
    def forward(ctx, gates: Tensor, penalty: Tensor) -> Tensor:
        ctx.save_for_backward(penalty)
        return gates.view_as(gates)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (penalty,) = ctx.saved_tensors
        return grad, torch.ones_like(penalty)


class _AttachToLoss(torch.autograd.Function):
    """Forward: ``loss`` unchanged; backward: ``penalty`` gets the loss's own gradient (its scale)."""

    @staticmethod
    def forward(ctx, loss: Tensor, penalty: Tensor) -> Tensor:
        return loss.clone()  # not a view: trainers scale the loss in place (Trainer: loss *= processes)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, grad


def attach(loss: Tensor, penalties: list[Tensor], weight: Tensor | float = 1.0) -> Tensor:
    """``loss`` [] with the layers' ``penalties`` (each []) riding on it: the same value; in the
    backward Σ penalties · ``weight`` gets the gradient the loss gets."""
    if not penalties:
        return loss
    total = torch.stack([p.to(device=loss.device, dtype=torch.float32) for p in penalties]).sum() * weight
    return _AttachToLoss.apply(loss, total.to(loss.dtype))


def penalty(gates: Tensor, k: int) -> Tensor:
    """The load-balanced L1 term of one layer without λ: gates [T, N] -> [] (N / (k T²) Σ_i c_i Σ_t R_ti)."""
    t, n = gates.shape
    counts = (gates > 0).sum(dim=0).to(gates.dtype).detach()  # [N]
    return (gates.sum(dim=0) * counts).sum() * (n / (k * t * t))


def remoe_gates(
    logits: Tensor, k: int, state: Tensor, scale: float, *, training: bool, sink: list | None = None
) -> Tensor:
    """ReLU gates [T, N] float32 of logits [T, N]. In training (with grad enabled) this forward's
    sparsity is added to ``state`` ([λ, Σ sparsity, forwards], float32, updated in place) and
    the penalty λ · ``scale`` · ``penalty`` (``scale``: 1, or 1/L for the paper's mean) is
    appended to ``sink`` (for ``attach`` to the loss), or without a sink attached to the gates
    at gradient scale 1."""
    gates = torch.relu(logits.float())  # [T, N]
    if training and torch.is_grad_enabled():
        with torch.no_grad():
            sparsity = 1.0 - (gates > 0).float().mean()
            state[1:].add_(torch.stack([sparsity, torch.ones_like(sparsity)]))
        term = state[0] * scale * penalty(gates, k)
        if sink is not None:
            sink.append(term)
        else:
            gates = _AttachPenalty.apply(gates, term)
    return gates


def update_coefficient(states: list[Tensor], target: float, rate: float) -> float | None:
    """After an optimizer step: λ ← λ · rate if S < target, else λ / rate (the official code's
    rule: at S = target too) in every router's ``state``, S the mean sparsity over the routers and
    forwards since the last update (then reset); ``target``:
    Q = 1 − k/N. Under torch.distributed the sums are taken over all processes, so every process
    keeps the same λ. Returns S, or None if no training forward ran (λ unchanged)."""
    sums = torch.stack([s[1:] for s in states]).sum(dim=0)  # [Σ sparsity, forwards]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(sums)
    forwards = float(sums[1])
    if forwards == 0:
        return None
    sparsity = float(sums[0]) / forwards
    factor = rate if sparsity < target else 1.0 / rate  # training.py: `if S < Q: λ *= α else: λ /= α`
    with torch.no_grad():
        for s in states:
            s[0].mul_(factor)
            s[1:].zero_()
    return sparsity


def relu_all(logits: Tensor) -> tuple[Tensor, Tensor]:
    """ReMoE's ReLU routing over every expert, its inference rule: [T, N] -> (weights [T, N]
    float32, ids [T, N] long, 0..N-1 in every row)."""
    w = torch.relu(logits.float())
    ids = torch.arange(logits.shape[-1], device=logits.device).expand(logits.shape[0], -1)
    return w, ids


class ReMoE(Method):
    name = "remoe"
    summary = (
        "ReMoE: ReLU gates, adaptive L1 penalty steering the mean number of active experts to k "
        "(training and eval; softmax families)"
    )
    groups = "never"
    balances = False
    options = MappingProxyType({"l1_coef": L1_COEF, "l1_rate": L1_RATE, "l1_layers": L1_LAYERS[0]})
    experts = "skip-weight"
    penalizes = True
    state_buffer = "probmoe_remoe"  # [λ, Σ sparsity, forwards]
    default_aux_loss = 0.0  # ReMoE balances by its L1 penalty

    def train_rule(self, logits: Tensor, gate: Gate) -> Routed:
        scale = 1.0 if gate.options.l1_layers == "sum" else 1.0 / gate.layers  # λ per layer, or λ/L
        weights = remoe_gates(logits, gate.top_k, gate.state, scale, training=True, sink=gate.sink)  # [T, N]
        return self._routed(weights)

    def infer_rule(self, logits: Tensor, gate: Gate) -> Routed:
        weights, _ = relu_all(logits)
        return self._routed(weights)

    @staticmethod
    def _routed(weights: Tensor) -> Routed:
        indices = torch.arange(weights.shape[-1], device=weights.device).expand_as(weights)  # [T, N]
        return Routed(weights, indices, indices, weights.detach() > 0)

    def serving(self, routing, top_k: int, num_experts: int, biased: bool) -> Serving:
        return Serving("remoe", num_experts, 0, normalizes=False)

    def initial_state(self, options) -> list[float]:
        return [options.l1_coef, 0.0, 0.0]

    def after_step(self, states: list[Tensor], *, top_k: int, num_experts: int, options) -> dict:
        sparsity = update_coefficient(states, 1.0 - top_k / num_experts, options.l1_rate)
        if sparsity is None:
            return {}
        return {"remoe_sparsity": sparsity, "remoe_l1_coef": float(states[0][0])}

    def describe(self, routing, top_k: int) -> str:
        return f"remoe (ReLU gates: any number of experts per token, trained towards {top_k} on average)"

    def legacy_options(self, values: dict, given: dict) -> dict:
        if "l1_layers" not in given:
            return {**values, "l1_layers": "mean"}  # written before the option existed, when the penalty was λ/L
        return values


register_method(ReMoE())
