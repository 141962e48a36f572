"""The group DP (``circuits.GroupDP``, the two-level lattice of ``circuits.kernels.torch_groups``)
against brute force (log Z, marginals, the whole Jacobian Cov(z), the MAP's value), chi-squared on
draws, the compiled circuit of the same spec at 64 and 256 variables (float64, and fp32 on hard
rows within 1e-6), and routing with ``algorithm="dp"``."""

import pytest
import torch
from brute import exact
from brute import group_models as models
from group_specs import SPECS
from hard_rows import hard_logits
from stats import chi2_pvalue, mask_counts

import circuits
import probmoe
from circuits import GroupCapacity, GroupLimited
from probmoe import SubsetDistribution


def logits(spec, T: int = 7, scale: float = 2.0, seed: int = 0) -> torch.Tensor:
    """[T, n] float64 N(0, scale²) with a -inf entry in row 0 (where the spec stays satisfiable)."""
    r = torch.randn(T, spec.n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    r[0, 0] = -torch.inf
    return r


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_matches_brute_force(spec, device):
    allowed = models(spec)
    dp = circuits.GroupDP(spec, device)
    r = logits(spec, seed=spec.n)
    want = exact(r, allowed)
    rd = r.to(device).requires_grad_()
    log_z = dp.log_partition(rd)
    torch.testing.assert_close(log_z.detach().cpu(), want.log_partition, atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad(log_z.sum(), rd)  # d log Z / d r = m - sigmoid(r)
    torch.testing.assert_close(grad.cpu(), want.marginals - torch.sigmoid(r), atol=1e-12, rtol=0)
    m = dp.marginals(rd)
    torch.testing.assert_close(m.detach().cpu(), want.marginals, atol=1e-12, rtol=0)
    jacobian = torch.stack([torch.autograd.grad(m[:, i].sum(), rd, retain_graph=True)[0] for i in range(spec.n)], 1)
    torch.testing.assert_close(jacobian.cpu(), want.cov, atol=1e-12, rtol=0)  # Cov(z), row by row
    z = dp.map(r.to(device)).cpu()
    assert torch.isin(z, torch.tensor([0.0, 1.0], dtype=z.dtype)).all()
    best = (want.map * r.clamp(min=-1e30)).sum(-1)  # the MAP's value (a tie may pick another subset)
    torch.testing.assert_close((z * r.clamp(min=-1e30)).sum(-1), best, atol=1e-12, rtol=0)
    r32 = r.float().to(device)  # float32 logits: float64 lattices inside, rounded once
    torch.testing.assert_close(dp.marginals(r32).cpu().double(), want.marginals, atol=1e-6, rtol=0)


@pytest.mark.parametrize("spec", [SPECS[2], SPECS[3], SPECS[8], SPECS[11]], ids=str)
def test_draws_follow_the_distribution(spec):
    allowed = models(spec)
    r = logits(spec, T=2, seed=3)[1:]  # [1, n]
    want = exact(r, allowed).probs[0]
    dp = circuits.GroupDP(spec)
    draws = dp.sample(r.expand(6000, -1).contiguous(), generator=torch.Generator().manual_seed(5))
    counts = mask_counts(draws, allowed)  # asserts that every draw is allowed
    assert chi2_pvalue(counts, want) > 1e-3
    m, z = dp.marginals_and_sample(r.expand(6000, -1).contiguous(), torch.Generator().manual_seed(5))
    assert torch.equal(z, draws)  # one seed, one draw, whichever query makes it
    torch.testing.assert_close(m[0], exact(r, allowed).marginals[0], atol=1e-12, rtol=0)


def hard_rows(n: int, T: int = 12) -> torch.Tensor:
    """[T, n] float32: ``hard_logits``' rows (N(0, 9), -inf entries, all equal, scale 100, +1e4, all
    -6), and rows at -1e4 and saturated at ±80."""
    r = hard_logits(T, n, seed=n)
    g = torch.Generator().manual_seed(n + 1)
    r[5] -= 1e4
    r[6] = torch.where(torch.rand(n, generator=g) < 0.5, 80.0, -80.0)
    r[7, ::3] = 80.0
    return r


DEEPSEEK = GroupLimited(256, 8, 8, 4)  # DeepSeek-V3's gate: 8 of 256 in at most 4 of 8 groups
LARGE = [
    GroupLimited(64, 8, 8, 3),
    GroupCapacity(64, 8, 8, 2),
    GroupLimited(64, None, [8, 16, 8, 32], 2, capacity=6, kmin=4, kmax=8),
    DEEPSEEK,
]


@pytest.mark.parametrize("spec", LARGE, ids=str)
def test_matches_the_compiled_circuit(spec):
    dp, c = circuits.GroupDP(spec), circuits.compile_circuit(spec)
    r = hard_rows(spec.n)
    r64 = r.double()
    log_z = c.log_partition(r64)
    torch.testing.assert_close(dp.log_partition(r64), log_z, atol=0, rtol=1e-12)
    m = c.marginals(r64)
    torch.testing.assert_close(dp.marginals(r64), m, atol=1e-10, rtol=0)  # rows at 1e4: float64 ulps of 2e-12
    assert (dp.marginals(r).double() - m).abs().max() < 1e-6  # fp32 logits, on every hard row
    assert ((dp.log_partition(r).double() - log_z).abs() / log_z.abs().clamp(min=1)).max() < 1e-6
    v = torch.randn_like(r64)
    rr = r64.clone().requires_grad_()
    (want,) = torch.autograd.grad((c.marginals(rr) * v).sum(), rr)
    (got,) = torch.autograd.grad((dp.marginals(rr) * v).sum(), rr)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)  # Cov(z) v
    value = lambda z: (z.double() * r64.clamp(min=-1e30)).sum(-1)
    torch.testing.assert_close(value(dp.map(r)), value(c.map(r)), atol=0, rtol=1e-12)
    z = dp.sample(r, generator=torch.Generator().manual_seed(0))
    assert (c.log_partition(torch.where(z > 0, 1e6, -1e6).double()) > -5e5).all()  # every draw allowed


def test_the_engine_and_the_checks():
    spec = GroupLimited(16, 4, 4, 2)
    dp = circuits.engine(spec, algorithm="dp")
    assert isinstance(dp, circuits.GroupDP) and dp.kernels(torch.float32).name == "torch"
    assert isinstance(circuits.engine(circuits.compile_circuit(spec), algorithm="dp"), circuits.GroupDP)
    assert repr(dp) == "GroupDP(GroupLimited(n=16, k=4, groups=4x4, max_groups=2), device=cpu)"
    with pytest.raises(ValueError, match="GroupLimited and GroupCapacity specs, got ExactlyK"):
        circuits.GroupDP(circuits.ExactlyK(16, 4))
    r = torch.randn(3, 16)
    r[1, 4:] = -torch.inf  # 4 logits above -inf, all in the first group: allowed
    dp.marginals(r)
    r[1, 2:4] = -torch.inf  # 2 left: k = 4 cannot be reached
    with pytest.raises(ValueError, match="fewer than kmin = 4 logits above -inf that GroupLimited"):
        dp.marginals(r)
    with pytest.raises(ValueError, match="fewer than kmin = 4"):
        dp.check_satisfiable(r)
    with pytest.raises(ValueError, match="NaN"):
        dp.sample(torch.full((2, 16), torch.nan))
    with (
        pytest.raises(ValueError, match="the group DP has torch sweeps and Triton kernels, no C sweeps"),
        circuits.implementation("c"),
    ):
        dp.marginals(torch.randn(2, 16))


def test_routing_with_the_group_dp():
    spec = GroupLimited(64, 8, 8, 3)
    r = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)) * 2
    got = probmoe.route(r, constraint=spec, training=False, algorithm="dp")
    want = probmoe.route(r, constraint=spec, training=False)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.weights, want.weights)  # the MAP
    rr = r.clone().requires_grad_()
    out = probmoe.route(rr, constraint=spec, training=True, algorithm="dp", generator=torch.Generator().manual_seed(2))
    chosen = torch.zeros_like(r).scatter(1, out.indices, out.mask.float())
    assert (chosen.sum(-1) == 8).all()
    assert (chosen.view(32, 8, 8).sum(-1).gt(0).sum(-1) <= 3).all()  # every draw is allowed
    out.weights.sum().backward()
    assert torch.isfinite(rr.grad).all()
    dp = SubsetDistribution(r.double(), constraint=spec, algorithm="dp")
    circuit = SubsetDistribution(r.double(), constraint=spec)
    torch.testing.assert_close(dp.mean, circuit.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(dp.log_partition, circuit.log_partition, atol=1e-12, rtol=0)
    ranged = GroupLimited(64, None, 8, 3, kmin=2, kmax=6)
    dp = SubsetDistribution(r.double(), constraint=ranged, algorithm="dp")
    circuit = SubsetDistribution(r.double(), constraint=ranged)
    torch.testing.assert_close(dp.cardinality_probs, circuit.cardinality_probs, atol=1e-12, rtol=0)


def test_compiles_without_a_graph_break():
    spec = GroupCapacity(16, 4, 4, 2)
    dp = circuits.GroupDP(spec)
    r = torch.randn(5, 16, generator=torch.Generator().manual_seed(0)).requires_grad_()
    v = torch.randn(5, 16)
    fn = torch.compile(lambda x: (dp.marginals(x) * v).sum(), fullgraph=True)
    (got,) = torch.autograd.grad(fn(r), r)
    (want,) = torch.autograd.grad((dp.marginals(r) * v).sum(), r)
    torch.testing.assert_close(got, want)


def test_tokens_in_chunks_give_the_same_answers(monkeypatch):
    """A call runs over ``CHUNK`` tokens at a time: the answers and the draws do not depend on it."""
    from circuits.kernels import torch_groups

    spec = GroupLimited(10, None, [2, 3, 5], 2, capacity=2, kmin=2, kmax=4)
    dp = circuits.GroupDP(spec)
    r = logits(spec, T=11).float()
    v = torch.randn_like(r)

    def answers():
        rr = r.clone().requires_grad_()
        m, z = dp.marginals_and_sample(rr, torch.Generator().manual_seed(4))
        (cov,) = torch.autograd.grad((m * v).sum(), rr)
        return dp.log_partition(r), m.detach(), z, cov, dp.map(r), dp.sample(r, torch.Generator().manual_seed(4))

    whole = answers()
    monkeypatch.setattr(torch_groups, "CHUNK", 3)
    for got, want in zip(answers(), whole, strict=True):
        assert torch.equal(got, want)


def test_shapes_dtypes_and_edge_sizes():
    spec = GroupCapacity(8, 4, 4, 1)
    dp = circuits.GroupDP(spec)
    r = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    want = dp.marginals(r.double())
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        m = dp.marginals(r.to(dtype))
        assert m.shape == (2, 3, 8) and m.dtype == dtype
        torch.testing.assert_close(m.double(), want, atol=1e-2 if dtype != torch.float32 else 1e-6, rtol=0)
    assert dp.sample(r).shape == (2, 3, 8) and dp.map(r).sum(-1).eq(4).all()
    empty = torch.empty(0, 8)
    assert dp.marginals(empty).shape == (0, 8) and dp.sample(empty).shape == (0, 8) and dp.map(empty).shape == (0, 8)
    assert dp.log_partition(empty).shape == (0,)
    none = circuits.GroupDP(GroupLimited(8, 0, 4, 2))  # only the empty set: log Z = Σ log sigma(-r)
    r2 = r.reshape(-1, 8)
    torch.testing.assert_close(none.log_partition(r2), torch.nn.functional.logsigmoid(-r2).sum(-1))
    assert none.marginals(r2).eq(0).all() and none.sample(r2).eq(0).all() and none.map(r2).eq(0).all()


def test_rows_that_allow_nothing_are_nan_when_unchecked():
    dp = circuits.GroupDP(GroupLimited(8, 3, 4, 2))
    r = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    r[1, 2:] = -torch.inf  # one group left: 2 < 3
    with pytest.raises(ValueError, match="fewer than kmin = 3"):
        dp.marginals(r)
    dp.validate = False  # the caller checked: nothing is looked at
    m, z = dp.marginals_and_sample(r, torch.Generator().manual_seed(1))
    assert m[1].isnan().all() and z[1].isnan().all() and not m[[0, 2]].isnan().any()
    assert dp.log_partition(r)[1] == -torch.inf and dp.map(r)[1].eq(0).all()
    torch.testing.assert_close(m[[0, 2]], circuits.compile_circuit(dp.spec).marginals(r[[0, 2]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("spec", [SPECS[3], SPECS[4], SPECS[8], SPECS[11], SPECS[1]], ids=str)
def test_log_counts_by_size(spec):
    """Every size's log-count from one pass, and its gradient Σ_j g_j m^(j), against brute force."""
    allowed = models(spec)
    dp = circuits.GroupDP(spec)
    assert dp.counts_by_size
    r = logits(spec, seed=2).requires_grad_()
    counts = dp.log_counts(r)  # [T, J]
    sizes = allowed.sum(-1)
    g = torch.randn(counts.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rr = r.detach().clamp(min=-1e30).requires_grad_()
    want = []
    for j in range(spec.kmin, spec.kmax + 1):
        these = allowed[sizes == j]
        want.append(torch.logsumexp(rr @ these.T, -1) if len(these) else torch.full((r.shape[0],), -torch.inf))
    want = torch.stack(want, -1)
    assert torch.equal(counts.isinf(), want.isinf())  # the sizes nothing allowed reaches
    torch.testing.assert_close(counts.detach()[want.isfinite()], want.detach()[want.isfinite()], atol=1e-12, rtol=0)
    (got,) = torch.autograd.grad((counts.masked_fill(counts.isinf(), 0) * g).sum(), r)
    (expected,) = torch.autograd.grad((want.masked_fill(want.isinf(), 0) * g).sum(), rr)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(dp.log_normalizer(r.detach()), torch.logsumexp(want.detach(), -1), atol=1e-12, rtol=0)
