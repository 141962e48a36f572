"""Logit rows that stress a selection of experts (shared by the fused routing operator's tests)."""

import torch


def hard_logits(T: int, N: int, seed: int = 0) -> torch.Tensor:
    """[T, N] float32 N(0, 3²) rows, and rows that stress the selection: -inf entries, an all-equal
    row (every score ties), a row at scale 100 (scores that underflow to 0 tie), a row shifted by
    1e4, a row of -6 (a range with kmin = 0 often draws nothing)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, N, generator=g) * 3
    r[0, : N // 3] = -torch.inf
    r[1] = 0.25
    r[2] = torch.randn(N, generator=g) * 100
    r[3] += 1e4
    r[4] = -6.0
    return r
