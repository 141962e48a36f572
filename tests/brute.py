"""Brute-force enumeration over all 2^n assignments: the ground truth for small n."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def masks(n: int, cardinalities) -> Tensor:
    """All assignments of n variables whose number of ones is in ``cardinalities``: [M, n] float64."""
    keep = set(cardinalities)
    rows = [m for m in itertools.product((0.0, 1.0), repeat=n) if int(sum(m)) in keep]
    return torch.tensor(rows, dtype=torch.float64).reshape(-1, n)


@dataclass
class Exact:
    """Exact quantities of P(x | x in masks) for logits r [T, n]."""

    masks: Tensor  # [M, n]
    log_partition: Tensor  # [T]
    probs: Tensor  # [T, M]
    marginals: Tensor  # [T, n]
    cov: Tensor  # [T, n, n]
    map: Tensor  # [T, n]


def exact(r: Tensor, allowed: Tensor) -> Exact:
    """Enumerate: log P_indep(allowed), conditional probabilities, marginals, covariance, MAP."""
    r = r.to(torch.float64)
    on = allowed.bool()[None]  # [1, M, n]
    lp = torch.where(on, F.logsigmoid(r)[:, None], F.logsigmoid(-r)[:, None]).sum(-1)  # [T, M]
    log_z = torch.logsumexp(lp, dim=-1)
    probs = torch.exp(lp - log_z[:, None])
    m = probs @ allowed
    second = torch.einsum("tm,mi,mj->tij", probs, allowed, allowed)
    return Exact(allowed, log_z, probs, m, second - m[:, :, None] * m[:, None, :], allowed[probs.argmax(-1)])
