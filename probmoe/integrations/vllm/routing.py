"""The inference rules, as vLLM routing functions (``FusedMoE(custom_routing_function=...)``).

Each takes the router logits r [T, N] and returns (weights [T, slots] float32, ids [T, slots]
int32), in plain torch with static shapes: no ``.item()``, no data-dependent Python branch, so a
CUDA graph can capture it. Every row's ids are distinct experts (they come from one ``topk`` or
are ``arange(N)``); unused slots carry weight exactly 0. What each computes (eval of
``probmoe.integrations.transformers``, the oracle of the tests):

    topk_bias(r, b, k):   ids = topk(π + b, k), w = π[ids] (renormalised if asked)   π = softmax(r)
    range_map(r, b, kmin, kmax):  ids = topk(r + b, kmax) (descending), used = the first
        clamp(#{r + b > 0}, kmin, kmax) slots (ProbMoE Dynamic-k's MAP, ``probmoe.route``),
        w = π(r)[ids] on used slots, 0 elsewhere (renormalised over the used ones if asked)
    sparsemixer_eval(r, k):  stage j takes the largest remaining logit, weight = the softmax of
        the remaining logits within its jitter band (SparseMixer v2 eval)
    relu_all(r):          ids = 0..N-1, w = ReLU(r) (ReMoE)

``bias`` is float32 [N] or None (for ``range_map`` with no bias, r + 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

JITTER_EPS = 0.01  # SparseMixer's band half-width (GRIN-MoE's router_jitter_noise)


def _ids(idx: Tensor) -> Tensor:
    return idx.to(torch.int32)


def _normalized(w: Tensor) -> Tensor:
    return w / w.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)


def topk_bias(logits: Tensor, bias: Tensor | None, k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """Top-k of softmax(r) + b, weights softmax(r) at the chosen: [T, N] -> ([T, k], [T, k])."""
    probs = torch.softmax(logits.float(), dim=-1)  # [T, N]
    key = probs if bias is None else probs + bias
    idx = torch.topk(key, k, dim=-1).indices  # [T, k], distinct
    w = probs.gather(-1, idx)
    return (w / w.sum(dim=-1, keepdim=True) if normalize else w), _ids(idx)


def range_map(logits: Tensor, bias: Tensor | None, kmin: int, kmax: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """ProbMoE Dynamic-k's MAP routing: [T, N] -> ([T, kmax], [T, kmax]); ids distinct, unused
    slots weight 0."""
    r = logits.float()  # [T, N]
    probs = torch.softmax(r, dim=-1)
    shifted = r if bias is None else r + bias
    idx = shifted.topk(kmax, dim=-1).indices  # [T, kmax], descending, distinct
    size = (shifted > 0).sum(dim=-1).clamp(kmin, kmax)  # [T]
    used = torch.arange(kmax, device=r.device) < size.unsqueeze(-1)  # [T, kmax]
    w = probs.gather(-1, idx)
    if bias is not None:  # as the transformers integration: π(r + b) / π(r + b) · π(r) at the used slots
        w_shifted = torch.softmax(shifted, dim=-1).gather(-1, idx)
        w = w_shifted / w_shifted.clamp_min(torch.finfo(torch.float32).tiny) * w
    w = torch.where(used, w, 0.0)
    return (_normalized(w) if normalize else w), _ids(idx)


def sparsemixer_eval(logits: Tensor, k: int, jitter_eps: float = JITTER_EPS) -> tuple[Tensor, Tensor]:
    """SparseMixer v2's deterministic eval routing: [T, N] -> ([T, k], [T, k])."""
    scores = logits.float()  # [T, N]
    remaining = scores
    weights, ids = [], []
    for _ in range(k):  # k is static: the loop unrolls under capture
        top, chosen = remaining.max(dim=-1, keepdim=True)  # [T, 1] each
        far = (top - scores) / scores.abs().clamp(min=top) > 2 * jitter_eps  # [T, N]
        probs = torch.softmax(remaining.masked_fill(far, float("-inf")), dim=-1)  # [T, N]
        weights.append(probs.gather(-1, chosen))
        ids.append(chosen)
        remaining = remaining.scatter(-1, chosen, float("-inf"))
    return torch.cat(weights, dim=-1), _ids(torch.cat(ids, dim=-1))


def relu_all(logits: Tensor) -> tuple[Tensor, Tensor]:
    """ReMoE's ReLU routing over every expert: [T, N] -> ([T, N], [T, N])."""
    w = torch.relu(logits.float())
    ids = torch.arange(logits.shape[-1], device=logits.device, dtype=torch.int32).expand(logits.shape[0], -1)
    return w, ids.contiguous()


def routing_function(rule, bias: Tensor | None):
    """The vLLM ``custom_routing_function`` of a ``settings.Rule`` (with one layer's bias [N])."""
    kind, slots, kmin, normalize, jitter_eps = rule.kind, rule.slots, rule.kmin, rule.normalize, rule.jitter_eps

    def route(hidden_states: Tensor, gating_output: Tensor, topk: int, renormalize: bool):
        # topk / renormalize are vLLM's (the config's); the rule's own values decide
        if kind == "topk":
            return topk_bias(gating_output, bias, slots, normalize)
        if kind == "range":
            return range_map(gating_output, bias, kmin, slots, normalize)
        if kind == "sparsemixer":
            return sparsemixer_eval(gating_output, slots, jitter_eps)
        return relu_all(gating_output)

    route.probmoe_rule = rule
    return route
