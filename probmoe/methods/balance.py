"""Auxiliary-loss-free balancing (DeepSeek-V3, Wang et al. 2024), the part every framework shares:
a per-expert bias b [N] added to the scores the experts are *selected* by, never to the weights
they are mixed with, and after each optimizer step

    b_i ← b_i + γ · sign(mean_j load_j − load_i)            (``bias_step``)

with load_i the tokens routed to expert i by the step's training forwards. Where it enters:

    top-k methods: the top-k of π + b (``topk.topk_rule``)
    ProbMoE methods: P(S) ∝ exp Σ_{i∈S} (r_i + b_i), the subsets of the shifted logits; the
        weights are the unbiased π(r) at S with Eq. 7's straight-through gradient through the
        marginals of the shifted distribution (``unbiased_weights``)

One copy of each rule: the transformers integration (``balance="aux-free"``), torchtitan's and
Megatron's routers (their expert bias) and vLLM's rules call these.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probmoe.scores import gate_scores

BALANCES = ("aux-free",)  # the balancing kinds (``RoutingOptions.balance``)
BALANCE_RATE = 1e-3  # γ, DeepSeek-V3's bias update speed


def unbiased_weights(routing, logits: Tensor, shifted: Tensor, scores: str, normalize: bool) -> Tensor:
    """The weights [T, K] of a ``probmoe.Routing`` drawn from the ``shifted`` logits r + b [T, N]
    (routed without normalisation), carried over to the unbiased scores π(r), r = ``logits``: each
    used slot's w' = (1 + δ) π(r + b), δ the straight-through term (value 0), becomes
    w' / π(r + b) · π(r), whose value and gradient are (1 + δ) π(r)'s (the π(r + b) factors cancel in
    both); unused slots stay exactly 0. Normalised over the used slots if ``normalize``."""
    idx, mask = routing.indices, routing.mask  # [T, K]
    pi = gate_scores(logits.float(), scores).gather(-1, idx)  # [T, K]
    pi_shifted = gate_scores(shifted, scores).gather(-1, idx).clamp_min(torch.finfo(torch.float32).tiny)
    w = torch.where(mask, routing.weights / pi_shifted * pi, torch.zeros_like(pi))
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    return w


def bias_step(bias: Tensor, load: Tensor, rate: float) -> None:
    """bias [N] (in place) += rate · sign(mean load − load_i); load [N] the tokens per expert."""
    bias.add_(rate * torch.sign(load.mean() - load).to(bias.device, bias.dtype))
