"""ReMoE (Wang et al., ICLR 2025): ReLU routing with an adaptive, load-balanced L1 penalty.

    gates R = ReLU(r)  [T, N]: expert i runs on token t iff R_{t,i} > 0, weighted by R_{t,i}
        (no top-k, no softmax, no renormalisation; training and eval alike)
    penalty of one layer: λ · N / (k T²) · Σ_i c_i Σ_t R_{t,i},  c_i = #{t : R_{t,i} > 0} (constant)
        (the paper's L1 term weighted by the load f_i = N c_i / (k T), averaged over the L layers;
        it is the official Megatron code's ``switch_load_balancing_loss_func`` on ReLU outputs)
    after each optimizer step: λ ← λ · α^sign(Q − S), Q = 1 − k / N the target sparsity and S the
        mean fraction of zero gates over the layers and forwards of the step; λ₀ = 1e-8 and
        α = 1.2 are the paper's

The penalty enters the gradient as Megatron's ``MoEAuxLossAutoScaler`` does: attached to the
gates, it adds ∂penalty/∂R to their gradient without appearing in the loss value, so any training
loop (transformers.Trainer, probmoe-train, a hand-written one) gets it; λ and the sparsity
counters live in each router's buffer ``probmoe_remoe`` = [λ, Σ sparsity, forwards], and
``controls.after_step`` applies the update (``RoutingControlCallback`` calls it in a Trainer).
"""

from __future__ import annotations

import torch
from torch import Tensor

L1_COEF = 1e-8  # λ₀
L1_RATE = 1.2  # α


class _AttachPenalty(torch.autograd.Function):
    """Forward: ``gates`` unchanged; backward: also the gradient of ``penalty`` (scale 1)."""

    @staticmethod
    def forward(ctx, gates: Tensor, penalty: Tensor) -> Tensor:
        ctx.save_for_backward(penalty)
        return gates.view_as(gates)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (penalty,) = ctx.saved_tensors
        return grad, torch.ones_like(penalty)


def penalty(gates: Tensor, k: int) -> Tensor:
    """The load-balanced L1 term of one layer without λ: gates [T, N] -> [] (N / (k T²) Σ_i c_i Σ_t R_ti)."""
    t, n = gates.shape
    counts = (gates > 0).sum(dim=0).to(gates.dtype).detach()  # [N]
    return (gates.sum(dim=0) * counts).sum() * (n / (k * t * t))


def remoe_gates(logits: Tensor, k: int, state: Tensor, layers: int, *, training: bool) -> Tensor:
    """ReLU gates [T, N] float32 of logits [T, N]. In training (with grad enabled) the penalty
    λ/L · ``penalty`` is attached to them and this forward's sparsity is added to ``state``
    ([λ, Σ sparsity, forwards], float32, updated in place); ``layers``: L."""
    gates = torch.relu(logits.float())  # [T, N]
    if training and torch.is_grad_enabled():
        with torch.no_grad():
            sparsity = 1.0 - (gates > 0).float().mean()
            state[1:].add_(torch.stack([sparsity, torch.ones_like(sparsity)]))
        gates = _AttachPenalty.apply(gates, state[0] / layers * penalty(gates, k))
    return gates


def update_coefficient(states: list[Tensor], target: float, rate: float) -> float | None:
    """After an optimizer step: λ ← λ · rate^sign(target − S) in every router's ``state``, S the
    mean sparsity over the routers and forwards since the last update (then reset); ``target``:
    Q = 1 − k/N. Under torch.distributed the sums are taken over all processes, so every process
    keeps the same λ. Returns S, or None if no training forward ran (λ unchanged)."""
    sums = torch.stack([s[1:] for s in states]).sum(dim=0)  # [Σ sparsity, forwards]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(sums)
    forwards = float(sums[1])
    if forwards == 0:
        return None
    sparsity = float(sums[0]) / forwards
    factor = rate if sparsity < target else 1.0 / rate if sparsity > target else 1.0
    with torch.no_grad():
        for s in states:
            s[0].mul_(factor)
            s[1:].zero_()
    return sparsity
