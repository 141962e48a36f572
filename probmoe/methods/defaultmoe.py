""" "defaultmoe": DefaultMoE (Panda et al. 2025, "Dense Backpropagation Improves Training for Sparse
Mixture-of-Experts"): the forward stays sparse top-k; the router's backward is dense, with an
exponential moving average of each expert's outputs standing in for the experts a token did not
use.

    forward:   y = Σ_{i ∈ A} g_i E_i(x)                           A = the stock top-k
    router:    ∂/∂g of  Σ_{i ∈ A} g_i E_i(x) + Σ_{i ∉ A} g_i Ê_i   (the default outputs Ê_i [D])
    defaults:  Ê_i ← β Ê_i + (1 − β) · mean of E_i(x_t) over this forward's tokens t routed to i
               (an expert no token used keeps its Ê_i); Ê = 0 at patching, β = 0.9

g is the stock gate: π = softmax(r) (sigmoid(r) for DeepSeek-V3), or with renormalisation the
DenseMixer form π·(1 − mask)/stopgrad(norm) + π·mask/norm, times DeepSeek-V3's scaling factor.
The update runs in each training forward before the term is formed (so Ê includes this forward's
outputs), not in a checkpoint recomputation; also under ``torch.no_grad()`` in train mode (as
BatchNorm's running statistics; reentrant checkpointing's first pass runs so). β, this order, the
zero start and the no_grad behaviour are our reading of the paper: its code (vatsal0/default-moe)
could not be read to confirm them (docs/transformers.md, "DefaultMoE").

As router output (``defaultmoe_weights``): all N slots, the k selected first; the weights'
forward value is the stock top-k weights on the selected slots and exactly 0 on the others, the
gradient dg on all N. The patched experts (``experts.DefaultExperts``) compute only the k
selected slots and add Σ_{s ≥ k} w_s Ê_{idx_s} (value 0, gradient <∂L/∂y, Ê_i> to g_i).

The EMA Ê (the method's per-step state) lives in the experts it needs (``experts = "default"``:
the transformers integration's ``DefaultExperts``), which call ``update_defaults``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Gate, Routed
from .densemixer import densemixer_weights
from .registry import register_method
from .topk import TopK

BETA = 0.9


def defaultmoe_weights(
    logits: Tensor, k: int, normalize: bool, *, scores: str = "softmax", top_idx: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(weights [T, N], indices [T, N], top-k indices [T, k]): slots 0..k-1 the top-k experts
    (``top_idx`` when the stock router chose them otherwise), slots k..N-1 the others in index
    order; weights as ``densemixer_weights`` (value: stock top-k weights, 0 elsewhere)."""
    weights, _, top_idx = densemixer_weights(logits, k, normalize, scores=scores, top_idx=top_idx)  # [T, N]
    n = weights.shape[-1]
    mask = torch.zeros_like(weights, dtype=torch.bool).scatter_(-1, top_idx, True)  # [T, N]
    rest = torch.sort(mask.to(torch.int8), dim=-1, stable=True).indices[:, : n - k]  # unselected, index order
    indices = torch.cat([top_idx, rest], dim=-1)  # [T, N]
    return weights.gather(-1, indices), indices, top_idx


def update_defaults(defaults: Tensor, rows: Tensor, experts: Tensor, beta: float = BETA) -> None:
    """defaults [N, D] float32 (in place) ← β·defaults + (1 − β)·per-expert mean of ``rows``
    [A, D] (unweighted expert outputs) grouped by ``experts`` [A] long; experts without rows
    keep theirs."""
    n = defaults.shape[0]
    sums = torch.zeros_like(defaults).index_add_(0, experts, rows.detach().float())  # [N, D]
    counts = torch.bincount(experts, minlength=n).to(defaults.dtype).unsqueeze(-1)  # [N, 1]
    fresh = beta * defaults + (1 - beta) * sums / counts.clamp(min=1)
    defaults.copy_(torch.where(counts > 0, fresh, defaults))


class DefaultMoE(TopK):
    name = "defaultmoe"
    summary = (
        "training: stock top-k forward, dense router gradient from the default outputs (EMA) of the "
        "unselected experts (DefaultMoE); eval: stock top-k"
    )
    stock_choice = True
    experts = "default"

    def stock(self, training: bool) -> bool:
        return not training

    def train_rule(self, logits: Tensor, gate: Gate) -> Routed:
        weights, indices, top_idx = defaultmoe_weights(
            logits, gate.top_k, gate.normalize, scores=gate.scores, top_idx=gate.stock_indices
        )
        return Routed(weights, indices, top_idx.detach())


register_method(DefaultMoE())
