"""Two decisions every router and statistic makes, each made here once.

gate_scores(r, kind)                 the gate scores π [T, N]: softmax(r), or sigmoid(r) for
                                     sigmoid gates (DeepSeek-V3); ``normalized``: scaled to
                                     sum to 1 per token, the routing distribution that
                                     statistics and the load-balancing loss read
dense_selection(idx, mask, n)        the used experts [T, kmax] slots -> [T, N] bool
normalized(w)                        used weights [T, kmax] divided by their sum
"""

from __future__ import annotations

import torch
from torch import Tensor

from circuits.kernels.straight_through import KINDS, scores  # the score kinds' one home

__all__ = ["KINDS", "dense_selection", "gate_scores", "normalized"]


def gate_scores(r: Tensor, kind: str, *, normalized: bool = False) -> Tensor:
    """Router logits r [..., N] -> gate scores [..., N] in r's dtype: softmax(r) ("softmax") or
    sigmoid(r) ("sigmoid"); with ``normalized`` the sigmoid scores divided by their sum (softmax
    scores already sum to 1)."""
    p = scores(r, kind)  # ValueError naming KINDS for another kind
    return p / p.sum(dim=-1, keepdim=True) if normalized and kind == "sigmoid" else p


def dense_selection(indices: Tensor, mask: Tensor, num_experts: int) -> Tensor:
    """indices [T, kmax] long, mask [T, kmax] bool (the used slots; unused ones may repeat any
    expert) -> [T, N] bool, True where some used slot holds the expert."""
    dense = torch.zeros(indices.shape[0], num_experts, dtype=torch.int32, device=indices.device)
    return dense.scatter_add_(-1, indices, mask.int()) > 0


def normalized(w: Tensor) -> Tensor:
    """The used weights w [T, kmax] divided by their sum (0 on unused slots stays 0). A floor instead
    of 0 when every used score underflowed (sigmoid below -104, or a constraint that excludes the
    argmax): weights 0, not NaN, as stock DeepSeek-V3's + 1e-20."""
    return w / w.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
