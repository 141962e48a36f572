""" "densemixer": DenseMixer. Training: a dense forward over all N experts, only the top-k in the
output; the router's gradient through the gate at every expert. Eval: the stock top-k. The
weights as router output (``densemixer_weights``) are DefaultMoE's too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probmoe.scores import gate_scores

from .base import Gate, Routed
from .registry import register_method
from .topk import TopK


def densemixer_weights(
    logits: Tensor, k: int, normalize: bool, *, scores: str = "softmax", top_idx: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """DenseMixer as router output: (weights [T, N], indices [T, N], top-k indices [T, k]).

    Forward value: the stock top-k weights at the top-k experts, exactly 0 elsewhere (so every
    expert runs on every token, but only the top-k enter the output and receive gradients).
    Backward: through g at all N experts, g = π = softmax(r) (``scores="sigmoid"``: sigmoid(r)),
    or with renormalisation DenseMixer's "partscale_fix_expert" g = π·(1 − mask)/stopgrad(norm) +
    π·mask/norm, norm = Σ_top-k π. ``top_idx`` [T, k]: the experts the stock router chose, when it
    chooses otherwise than by the top-k of π (DeepSeek-V3's groups and bias).
    """
    probs = gate_scores(logits.float(), scores)  # [T, N]
    if top_idx is None:
        top_idx = torch.topk(probs, k, dim=-1).indices  # [T, k], as the stock routers
    top = probs.gather(-1, top_idx)  # [T, k]
    mask = torch.zeros_like(probs).scatter_(-1, top_idx, 1.0)  # [T, N] {0, 1}
    if normalize:
        norm = top.sum(dim=-1, keepdim=True)  # [T, 1], the stock denominator
        g = probs * (1 - mask) / norm.detach() + probs * mask / norm
    else:
        g = probs
    weights = (mask * g).detach() + (g - g.detach())  # value: mask·g; gradient: dg at all N
    indices = torch.arange(probs.shape[-1], device=probs.device).expand_as(probs)  # [T, N]
    return weights, indices, top_idx


class DenseMixer(TopK):
    name = "densemixer"
    summary = "training: dense forward over all N experts (DenseMixer); eval: stock top-k"
    stock_choice = True
    dense_training = True

    def stock(self, training: bool) -> bool:
        return not training

    def train_rule(self, logits: Tensor, gate: Gate) -> Routed:
        weights, indices, top_idx = densemixer_weights(
            logits, gate.top_k, gate.normalize, scores=gate.scores, top_idx=gate.stock_indices
        )
        return Routed(weights, indices, top_idx.detach())


register_method(DenseMixer())
