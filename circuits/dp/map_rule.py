"""The MAP subset of P(S | C) ∝ exp(Σ_{i∈S} r_i), |S| in [kmin, kmax] (S a subset of the
variables), in closed form.

The best subset of size j is the top-j logits; its score is the prefix sum of the logits sorted
in descending order, which grows exactly while the next logit is positive. So the MAP size is
clamp(#{r_i > 0}, kmin, kmax) and the MAP set is the top logits of that size. (The paper's Alg. 3
takes the argmax of prefix sums of sorted softmax probabilities, which is always kmax.)
Exactly-k is the special case kmin = kmax = k: the top-k logits.
"""

from __future__ import annotations

import torch
from torch import Tensor


def map_size(logits: Tensor, kmin: int, kmax: int) -> Tensor:
    """The number of true variables in the MAP subset: [..., N] -> [...] long."""
    return (logits > 0).sum(dim=-1).clamp(kmin, kmax)


def map_mask(logits: Tensor, kmin: int, kmax: int) -> Tensor:
    """The MAP subset as a {0, 1} mask in the logits' dtype: [..., N] -> [..., N]."""
    top = logits.topk(kmax, dim=-1).indices  # [..., kmax], descending
    keep = torch.arange(kmax, device=logits.device) < map_size(logits, kmin, kmax).unsqueeze(-1)  # [..., kmax]
    return torch.zeros_like(logits).scatter_(-1, top, keep.to(logits.dtype))
