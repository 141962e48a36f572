"""Goodness-of-fit for samplers: Pearson's chi-squared test against exact probabilities."""

from __future__ import annotations

import torch
from torch import Tensor


def chi2_pvalue(counts: Tensor, probs: Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi^2 test of ``counts`` [M] against ``probs`` [M] (sum 1).

    Cells with expected count below ``min_expected`` are pooled into one cell. The survival
    function of chi^2(df) at x is the regularised upper incomplete gamma Q(df / 2, x / 2).
    """
    counts, probs = counts.double(), probs.double()
    expected = probs * counts.sum()
    small = expected < min_expected
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    stat = ((counts - expected) ** 2 / expected.clamp_min(1e-300)).sum()
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2))


def mask_counts(draws: Tensor, allowed: Tensor) -> Tensor:
    """How often each row of ``allowed`` [M, n] occurs among ``draws`` [D, n]; asserts no other mask occurs."""
    n = allowed.shape[1]
    weights = 2 ** torch.arange(n, dtype=torch.float64)
    codes = (draws.double() @ weights).long()
    allowed_codes = (allowed.double() @ weights).long()
    lookup = torch.full((2**n,), -1, dtype=torch.long)
    lookup[allowed_codes] = torch.arange(len(allowed))
    idx = lookup[codes]
    assert bool((idx >= 0).all()), "a draw violates the constraint"
    return torch.bincount(idx, minlength=len(allowed))
