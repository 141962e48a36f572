"""The stock top-k rule, with an optional selection bias: the inference rule of every top-k method
(conventional, frozen, DenseMixer, DefaultMoE) and their training rule where it is the stock one.

    ids = topk(π + b, k), w = π[ids] (renormalised if asked)      π = softmax(r) or sigmoid(r)

Without a bias it is softmax + topk as the stock routers compute it (the transformers integration
runs the family's own router then, bit for bit; vLLM its own top-k).
"""

from __future__ import annotations

import torch
from torch import Tensor

from probmoe.scores import gate_scores

from .base import Gate, Method, Routed


def topk_rule(
    logits: Tensor, k: int, normalize: bool, scores: str = "softmax", bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """logits [T, N] -> (weights [T, k] float32, indices [T, k] long, distinct per row): π(r) at the
    top-k of π(r) + ``bias`` ([N] float32 or None), renormalised if ``normalize``."""
    probs = gate_scores(logits.float(), scores)  # [T, N]
    idx = torch.topk(probs if bias is None else probs + bias, k, dim=-1).indices  # [T, k]
    weights = probs.gather(-1, idx)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, idx


class TopK(Method):
    """A method routed by the stock top-k in eval (the base of the top-k methods)."""

    def stock(self, training: bool) -> bool:
        return True

    def infer_rule(self, logits: Tensor, gate: Gate) -> Routed:
        w, idx = topk_rule(logits, gate.k or gate.top_k, gate.normalize, gate.scores, gate.bias)
        return Routed(w, idx)

    def train_rule(self, logits: Tensor, gate: Gate) -> Routed:
        return self.infer_rule(logits, gate)
