"""Exact sampling: chi-squared tests of SubsetDistribution.sample against brute-force probabilities."""

import pytest
import torch
from brute import exact, masks
from stats import chi2_pvalue, mask_counts

import probmoe

DRAWS = 40_000
ROWS = [
    # (kmin, kmax, logits): exactly-k, ranges, a skewed row, a row with a -inf logit
    (3, 3, [0.3, -0.2, 1.0, 0.0, -1.1, 0.5]),
    (2, 4, [0.8, -0.5, 1.5, -2.0, 0.1, 0.4]),
    (1, 5, [3.0, -2.5, 0.0, 1.5, -4.0, -0.7]),
    (2, 3, [0.5, -float("inf"), 1.0, -0.3, 0.2, -1.0]),
]


@pytest.mark.parametrize("backend", ["dp", "circuit"])
@pytest.mark.parametrize("kmin,kmax,row", ROWS)
def test_chi_squared(backend, kmin, kmax, row):
    r = torch.tensor(row, dtype=torch.float64)
    other = torch.randn(6, dtype=torch.float64)  # a second token in the same batch: rows must not mix
    d = probmoe.SubsetDistribution(torch.stack([r, other]), kmin=kmin, kmax=kmax, backend=backend)
    gen = torch.Generator().manual_seed(1234)
    draws = d.sample((DRAWS,), generator=gen)  # [D, 2, 6]
    allowed = masks(6, range(kmin, kmax + 1))
    probs = exact(r[None], allowed).probs[0]
    assert chi2_pvalue(mask_counts(draws[:, 0], allowed), probs) > 1e-3
    wrong = torch.softmax(torch.randn(len(probs), generator=gen, dtype=torch.float64), 0)
    assert chi2_pvalue(mask_counts(draws[:, 0], allowed), wrong) < 1e-6  # the test can fail


@pytest.mark.parametrize("backend", ["dp", "circuit"])
def test_fused_mean_and_sample(backend):
    r = torch.tensor([0.8, -0.5, 1.5, -2.0, 0.1, 0.4], dtype=torch.float64).expand(DRAWS, 6)
    d = probmoe.SubsetDistribution(r, kmin=2, kmax=4, backend=backend)
    m, z = d.mean_and_sample(torch.Generator().manual_seed(7))
    allowed = masks(6, range(2, 5))
    ex = exact(r[:1], allowed)
    torch.testing.assert_close(m, ex.marginals.expand(DRAWS, 6), atol=1e-10, rtol=0)
    assert chi2_pvalue(mask_counts(z, allowed), ex.probs[0]) > 1e-3


@pytest.mark.parametrize("backend", ["dp", "circuit"])
def test_zero_draws(backend):
    d = probmoe.SubsetDistribution(torch.randn(3, 5), k=2, backend=backend)
    assert d.sample((0,)).shape == (0, 3, 5) and d.sample((2, 0)).shape == (2, 0, 3, 5)


def test_seeded_generator_is_reproducible():
    r = torch.randn(100, 64)
    a = probmoe.SubsetDistribution(r, kmin=4, kmax=8, backend="dp").sample(
        (3,), generator=torch.Generator().manual_seed(5)
    )
    b = probmoe.SubsetDistribution(r, kmin=4, kmax=8, backend="dp").sample(
        (3,), generator=torch.Generator().manual_seed(5)
    )
    assert torch.equal(a, b) and ((a.sum(-1) >= 4) & (a.sum(-1) <= 8)).all()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["dp", "circuit"])
def test_chi_squared_n10(backend):
    r = torch.randn(10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    allowed = masks(10, range(3, 6))
    d = probmoe.SubsetDistribution(r, kmin=3, kmax=5, backend=backend)
    draws = d.sample((1_000_000,), generator=torch.Generator().manual_seed(1))
    assert chi2_pvalue(mask_counts(draws, allowed), exact(r[None], allowed).probs[0]) > 1e-3
