"""Auxiliary router losses computed from what was actually routed.

HF's ``load_balancing_loss_func`` recomputes top-k from the logits, which is right for stock
top-k routing only; under sampled (ProbMoE) or dynamic-k routing the experts that ran differ.
Here the expert fractions come from the routers' records of the experts really used.

    load balancing (Switch Transformer, Eq. 4-6; HF's normalisation):
        N · Σ_i f_i · P_i,  f_i = (tokens routed to i) / T,  P_i = mean_t softmax(r_t)_i
        (sigmoid gates, DeepSeek-V3: P_i = mean_t of sigmoid(r_t)_i / Σ_j sigmoid(r_t)_j, the
        normalised scores of DeepSeek-V3's sequence-wise balance loss)
        (f sums to the mean number of experts per token; averaged over layers as HF does,
        padding tokens excluded by the attention mask)
    router z-loss (ST-MoE, Eq. 5): mean over layers and tokens of logsumexp(r_t)²
"""

from __future__ import annotations

import torch
from torch import Tensor

from probmoe.scores import gate_scores


def _token_mask(attention_mask: Tensor | None, rows: int, device) -> Tensor | None:
    """[B, S] attention mask -> [T] float weights, or None (no mask, or one that does not cover
    the routed tokens, as with a KV cache)."""
    if attention_mask is None or attention_mask.numel() != rows:
        return None
    return attention_mask.reshape(-1).to(device=device, dtype=torch.float32)


def load_balancing_loss(
    router_logits, selected, attention_mask: Tensor | None = None, scores: str = "softmax"
) -> Tensor:
    """router_logits: per layer [T, N] (differentiable); selected: per layer [T, N] bool, the
    experts used; attention_mask: [B, S] with B·S = T, or None; scores: the gate's scores,
    "softmax" or "sigmoid" (normalised over the experts). Returns a scalar (float32)."""
    if len(router_logits) != len(selected) or not router_logits:
        raise ValueError(
            f"need one selection per layer of router logits, got {len(router_logits)} logits and "
            f"{len(selected)} selections"
        )
    device = router_logits[0].device
    n = router_logits[0].shape[-1]
    fractions = torch.zeros(n, dtype=torch.float32, device=device)
    probs = torch.zeros(n, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for logits, used in zip(router_logits, selected):
        p = gate_scores(logits.to(device).float(), scores, normalized=True)  # [T, N]
        used = used.to(device=device, dtype=torch.float32)  # [T, N]
        mask = _token_mask(attention_mask, p.shape[0], device)
        if mask is None:
            fractions = fractions + used.sum(dim=0)
            probs = probs + p.sum(dim=0)
            rows = rows + p.shape[0]
        else:
            fractions = fractions + (used * mask.unsqueeze(-1)).sum(dim=0)
            probs = probs + (p * mask.unsqueeze(-1)).sum(dim=0)
            rows = rows + mask.sum()
    rows = rows.clamp(min=1)  # no (unmasked) token: fractions and probs are 0, and so is the loss
    return n * torch.sum((fractions / rows) * (probs / rows))


def router_z_loss(router_logits, attention_mask: Tensor | None = None) -> Tensor:
    """router_logits: per layer [T, N]. Returns mean_{layers, tokens} logsumexp(r)² (float32)."""
    total, rows = 0.0, 0.0
    for logits in router_logits:
        z = torch.logsumexp(logits.float(), dim=-1).square()  # [T, N] -> [T]
        mask = _token_mask(attention_mask, z.shape[0], z.device)
        total = total + (z.sum() if mask is None else (z * mask).sum())
        rows = rows + (z.shape[0] if mask is None else mask.sum())
    return total / max(rows, 1)  # no (unmasked) token: 0
