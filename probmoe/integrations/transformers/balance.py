"""Auxiliary-loss-free balancing (DeepSeek-V3, Wang et al. 2024): a per-expert bias b [N] added
to the scores the experts are *selected* by, never to the weights they are mixed with, and after
each optimizer step

    b_i ← b_i + γ · sign(mean_j load_j − load_i)

with load_i the tokens routed to expert i by the step's training forwards (over all processes
under torch.distributed). Where it enters (``patch_model(..., balance="aux-free")``):

    top-k methods (conventional, frozen, densemixer, defaultmoe): the top-k of π + b, π = softmax(r)
        (sigmoid for DeepSeek-V3, whose stock router does exactly this with its own
        ``e_score_correction_bias``); weights π at the chosen experts (renormalised as stock)
    ProbMoE methods: the subset distribution is that of the shifted logits, P(S) ∝ exp Σ_{i∈S}
        (r_i + b_i), so the bias moves which subsets are drawn (and the MAP at eval); the weights
        are the unbiased π(r) at S with the straight-through gradient of Eq. 7 through the
        marginals of the shifted distribution: w = (stopgrad(z − m) + m) ⊙ π(r), renormalised
        as the family does (``probmoe_weights``)

The bias is DeepSeek-V3's ``e_score_correction_bias`` buffer where the family has one (a stock
checkpoint key), else a buffer ``probmoe_bias`` added to the router (saved in
``probmoe_state.safetensors``); the loads since the last update are the router buffer
``probmoe_load``. The rules themselves (the biased top-k, the unbiased weights of a biased draw,
the bias step) are ``probmoe.methods``' (``topk.topk_rule``, ``balance``), shared with torchtitan,
Megatron and vLLM; this module holds the router buffers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probmoe.methods.balance import bias_step
from probmoe.methods.balance import unbiased_weights as probmoe_weights  # noqa: F401 (the name it had here)
from probmoe.methods.topk import topk_rule as biased_topk  # noqa: F401 (the name it had here)


def selection_bias(gate) -> Tensor:
    """The bias b [N] float32 of a patched router."""
    bias = gate._buffers.get("probmoe_bias")
    return bias if bias is not None else gate.e_score_correction_bias


def update_bias(gates, rate: float) -> list[float] | None:
    """After an optimizer step: b_i += rate · sign(mean load − load_i) in every router, from its
    ``probmoe_load`` (then reset); returns the loads' coefficient of variation per router that was
    sent some token (a router that saw none has no CV, and its bias moves by +γ everywhere), or
    None if no training forward ran since the last update."""
    loads = torch.stack([g.probmoe_load for g in gates])  # [L, N]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(loads)
    if float(loads.sum()) == 0:
        return None
    with torch.no_grad():
        for gate, load in zip(gates, loads):
            bias_step(selection_bias(gate), load, rate)
            gate.probmoe_load.zero_()
    return [float(load.std(unbiased=False) / load.mean()) for load in loads if float(load.sum()) > 0]
