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


def satisfies_groups(z: Tensor, spec) -> Tensor:
    """Whether each row of z [D, n] in {0, 1} meets a group spec (``circuits.GroupLimited`` or
    ``GroupCapacity``): [D] bool, straight from the definition."""
    z = z.double()
    per_group = torch.stack([part.sum(-1) for part in z.split(list(spec.groups), dim=-1)], -1)  # [D, G]
    size = z.sum(-1)
    return (
        ((z == 0) | (z == 1)).all(-1)
        & (size >= spec.kmin)
        & (size <= spec.kmax)
        & ((per_group > 0).sum(-1) <= spec.max_groups)
        & (per_group <= spec.capacity).all(-1)
    )


def group_models(spec) -> Tensor:
    """Every assignment that meets a group spec: [M, n] float64."""
    rows = torch.tensor(list(itertools.product((0.0, 1.0), repeat=spec.n)), dtype=torch.float64)
    return rows[satisfies_groups(rows, spec)]


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
