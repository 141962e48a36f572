"""SubsetDistribution against brute-force enumeration (float64, 1e-8), both backends, both gradient conventions."""

import pytest
import torch
import torch.nn.functional as F
from brute import exact, masks

import probmoe
from circuits.kernels import torch_dp as dp

BACKENDS = ["dp", "circuit"]
# (n, kmin, kmax): exactly-k, ranges, the empty set, the full range
CASES = [(6, 3, 3), (9, 2, 5), (10, 4, 4), (7, 0, 2), (8, 1, 8), (5, 0, 0), (10, 6, 9)]


def logits_for(n: int, kmin: int, seed: int = 0) -> torch.Tensor:
    """[4, n] float64: generic rows, one with -inf entries (still feasible), one shifted by +25."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(4, n, generator=g, dtype=torch.float64) * 2
    r[1, : max(0, min(2, n - kmin))] = -torch.inf
    r[2] += 25.0
    r[3] *= 4
    return r


def brute(r, kmin, kmax):
    allowed = masks(r.shape[-1], range(kmin, kmax + 1))
    return exact(r, allowed), allowed


def cov_paper(ex, r):
    """Cov(z) diag(1 - p): the Jacobian of the marginals in the paper / SIMPLE convention."""
    return ex.cov * torch.sigmoid(-r)[:, None, :]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grad", ["exact", "paper"])
@pytest.mark.parametrize("n,kmin,kmax", CASES)
def test_against_brute_force(backend, grad, n, kmin, kmax, device):
    r = logits_for(n, kmin)
    ex, allowed = brute(r, kmin, kmax)
    d = probmoe.SubsetDistribution(r.to(device), kmin=kmin, kmax=kmax, backend=backend, grad=grad)
    tol = dict(atol=1e-8, rtol=0)
    torch.testing.assert_close(d.mean.cpu(), ex.marginals, **tol)
    torch.testing.assert_close(d.log_partition.cpu(), ex.log_partition, **tol)
    torch.testing.assert_close(d.mode.cpu(), ex.map, **tol)
    lp = d.log_prob(allowed[:, None, :].to(device)).cpu()  # [M, T]
    torch.testing.assert_close(lp.exp().T, ex.probs, **tol)
    torch.testing.assert_close(torch.logsumexp(lp, dim=0), torch.zeros(4, dtype=torch.float64), **tol)
    sizes = allowed.sum(-1).long() - kmin  # [M]
    card = torch.zeros(4, kmax - kmin + 1, dtype=torch.float64).index_add_(1, sizes, ex.probs)
    torch.testing.assert_close(d.cardinality_probs.cpu(), card, **tol)
    h = -(ex.probs * torch.where(ex.probs > 0, ex.probs.log(), 0.0)).sum(-1)
    torch.testing.assert_close(d.entropy().cpu(), h, **tol)
    torch.testing.assert_close(d.variance.cpu(), ex.marginals * (1 - ex.marginals), **tol)


def block_jacobian(f, r):
    """d f(r)[t] / d r[t] for a row-wise f: [T, n] -> [T, n, n]."""
    J = torch.autograd.functional.jacobian(f, r)  # [T, n, T, n]
    return torch.stack([J[t, :, t, :] for t in range(r.shape[0])])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grad", ["exact", "paper"])
@pytest.mark.parametrize("n,kmin,kmax", [(6, 3, 3), (9, 2, 5), (8, 0, 8), (10, 6, 9)])
def test_jacobian_of_mean(backend, grad, n, kmin, kmax, device):
    r = logits_for(n, kmin, seed=1)
    ex, _ = brute(r, kmin, kmax)
    J = block_jacobian(
        lambda x: probmoe.SubsetDistribution(x, kmin=kmin, kmax=kmax, backend=backend, grad=grad).mean, r.to(device)
    ).cpu()
    want = ex.cov if grad == "exact" else cov_paper(ex, r)
    torch.testing.assert_close(J, want, atol=1e-8, rtol=0)


def official_paper_marginals(r, allowed):
    """The paper's convention written the official way: enumerate with log p differentiable and
    log(1 - p) detached (SIMPLE). An independent reference for grad="paper"."""
    on = allowed.bool()[None]
    lp = torch.where(on, F.logsigmoid(r)[:, None], F.logsigmoid(-r).detach()[:, None]).sum(-1)
    return torch.softmax(lp, dim=-1) @ allowed


@pytest.mark.parametrize("backend", BACKENDS)
def test_paper_convention_matches_the_official_formulation(backend):
    r = torch.randn(3, 7, dtype=torch.float64)
    allowed = masks(7, range(2, 5))
    want = block_jacobian(lambda x: official_paper_marginals(x, allowed), r)
    got = block_jacobian(lambda x: probmoe.SubsetDistribution(x, kmin=2, kmax=4, backend=backend, grad="paper").mean, r)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_of_log_partition_log_prob_and_entropy(backend):
    n, kmin, kmax = 8, 2, 5
    r = logits_for(n, kmin, seed=2).requires_grad_()
    ex, allowed = brute(r.detach(), kmin, kmax)
    d = probmoe.SubsetDistribution(r, kmin=kmin, kmax=kmax, backend=backend, grad="paper")
    p = torch.sigmoid(r.detach())
    (g,) = torch.autograd.grad(d.log_partition.sum(), r, retain_graph=True)
    torch.testing.assert_close(g, ex.marginals - p, atol=1e-8, rtol=0)  # exact whatever grad= says
    z = allowed[5].expand(4, n)
    (g,) = torch.autograd.grad(d.log_prob(z).sum(), r, retain_graph=True)
    torch.testing.assert_close(g, z - ex.marginals, atol=1e-8, rtol=0)
    (g,) = torch.autograd.grad(d.entropy().sum(), r, retain_graph=True)
    rf = torch.where(torch.isfinite(r.detach()), r.detach(), 0.0)
    torch.testing.assert_close(g, -torch.einsum("tij,tj->ti", ex.cov, rf), atol=1e-8, rtol=0)
    (g,) = torch.autograd.grad((d.cardinality_probs * torch.arange(kmin, kmax + 1.0)).sum(), r)  # d E|S|
    size = allowed.sum(-1)
    e_size = ex.probs @ size
    want = torch.einsum("tm,mi->ti", ex.probs * (size - e_size[:, None]), allowed)  # Cov(z, |S|)
    torch.testing.assert_close(g, want, atol=1e-8, rtol=0)


@pytest.mark.parametrize("kmin,kmax", [(8, 8), (4, 8)])
def test_backends_agree_at_n64(kmin, kmax):
    g = torch.Generator().manual_seed(3)
    r = torch.randn(32, 64, generator=g, dtype=torch.float64) * 3
    r[0, :50] = -torch.inf
    v = torch.randn(32, 64, generator=g, dtype=torch.float64)
    out = {}
    for backend in BACKENDS:
        x = r.clone().requires_grad_()
        d = probmoe.SubsetDistribution(x, kmin=kmin, kmax=kmax, backend=backend)
        (cv,) = torch.autograd.grad(d.mean, x, v)
        out[backend] = (d.mean, d.log_partition, d.cardinality_probs, d.entropy(), d.mode, cv)
    for a, b in zip(out["dp"], out["circuit"]):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_float32_matches_float64():
    r = torch.randn(64, 64, dtype=torch.float64) * 4
    for kmin, kmax in [(8, 8), (4, 8)]:
        want = dp.marginals(r, kmin, kmax)
        got = dp.marginals(r.float(), kmin, kmax)
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("kmin,kmax", [(3, 3), (1, 8), (0, 64), (2, 40)])
def test_float32_log_partition_with_outliers(kmin, kmax):
    """Paper-form log Z has its own lattice: no cancellation of log Z_nat - Σ softplus at logits ~1e4."""
    r = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    r[:, :3] += 1e4
    r[1, :3] += 3e3
    r[2, 5] = -torch.inf
    want = probmoe.SubsetDistribution(r.double(), kmin=kmin, kmax=kmax, backend="circuit").log_partition
    got = probmoe.SubsetDistribution(r, kmin=kmin, kmax=kmax, backend="dp").log_partition
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-6)


def test_exact_k_is_shift_invariant_and_extreme_logits_stay_finite():
    r = torch.randn(16, 64, dtype=torch.float64) * 3
    base = dp.marginals(r, 8, 8)
    for shift in (-300.0, 6.0, 300.0):
        torch.testing.assert_close(dp.marginals((r + shift).float(), 8, 8).double(), base, atol=2e-5, rtol=0)
    wild = torch.randn(16, 64) * 60  # logit gaps far beyond float32's exp range
    for kmin, kmax in [(8, 8), (4, 8), (1, 64)]:
        x = wild.clone().requires_grad_()
        d = probmoe.SubsetDistribution(x, kmin=kmin, kmax=kmax, backend="dp")
        m = d.mean
        assert torch.isfinite(m).all() and ((m.sum(-1) - kmin).abs() <= kmax - kmin + 1e-3).all()
        m.backward(torch.randn_like(m))
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_neg_inf_logits(backend):
    r = torch.randn(8, 12)
    r[:, :7] = -torch.inf  # 5 live experts
    x = r.clone().requires_grad_()
    d = probmoe.SubsetDistribution(x, kmin=2, kmax=6, backend=backend)
    assert (d.mean[:, :7] == 0).all() and (d.mode[:, :7] == 0).all()
    assert (d.sample((50,))[..., :7] == 0).all()
    assert d.cardinality_probs[:, -1].eq(0).all()  # 6 experts cannot be chosen from 5
    loss = d.mean.square().sum() + d.log_partition.sum() + d.entropy().sum() + d.log_prob(d.mode).sum()
    loss.backward()
    assert torch.isfinite(x.grad).all() and (x.grad[:, :7] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_shapes_and_dtypes(backend):
    r = torch.randn(2, 3, 10)
    d = probmoe.SubsetDistribution(r, 4, backend=backend)
    assert d.batch_shape == (2, 3) and d.event_shape == (10,) and d.k == 4
    z = d.sample((5, 7))
    assert z.shape == (5, 7, 2, 3, 10) and (z.sum(-1) == 4).all()
    assert d.log_prob(z).shape == (5, 7, 2, 3)
    assert d.mean.shape == (2, 3, 10) and d.log_partition.shape == (2, 3) and d.entropy().shape == (2, 3)
    assert d.cardinality_probs.shape == (2, 3, 1)
    assert d.support.check(z).all() and not d.support.check(torch.ones(10)).item()
    e = d.expand((4, 2, 3))
    assert e.batch_shape == (4, 2, 3) and e.mean.shape == (4, 2, 3, 10)
    for dtype in (torch.float16, torch.bfloat16):
        h = probmoe.SubsetDistribution(r.to(dtype), kmin=2, kmax=5, backend=backend)
        assert h.mean.dtype == dtype and h.sample().dtype == dtype
        torch.testing.assert_close(
            h.mean.float(), probmoe.SubsetDistribution(r.to(dtype).float(), kmin=2, kmax=5).mean, atol=1e-2, rtol=0
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_unbatched_logits(backend, float64):
    r = torch.randn(7)
    d = probmoe.SubsetDistribution(r, kmin=2, kmax=4, backend=backend)
    batched = probmoe.SubsetDistribution(r[None], kmin=2, kmax=4, backend=backend)
    assert d.batch_shape == () and d.log_partition.shape == () and d.entropy().shape == ()
    torch.testing.assert_close(d.log_partition, batched.log_partition[0])
    torch.testing.assert_close(d.entropy(), batched.entropy()[0])
    assert d.mean.shape == (7,) and d.cardinality_probs.shape == (3,) and d.log_prob(d.mode).shape == ()


def test_huge_finite_logits_are_rejected():
    """The DP's log-zero is -1e30: logits near it (or sums of many) used to give NaN after validation."""
    wide = torch.full((1, 64), -1e28, dtype=torch.float64)
    wide[0, 0] = 1e28  # |r| < 1e30, yet 64 tilted logits of -2e28 sum below the log-zero
    for r, k in [(torch.tensor([[1e30, -1e30, 0.0, 5.0, 1e38]], dtype=torch.float64), 3), (wide, 64)]:
        with pytest.raises(ValueError, match=r"logits must be -inf or finite with \|logits\| < 1e\+20"):
            probmoe.SubsetDistribution(r, k=k, backend="dp")
    wide[0, 0], wide[0, 1:] = 1e19, -1e19  # the largest accepted magnitudes stay finite
    for kmin, kmax in [(64, 64), (3, 3), (1, 5)]:
        assert torch.isfinite(probmoe.SubsetDistribution(wide, kmin=kmin, kmax=kmax, backend="dp").mean).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_sample_arguments(backend):
    d = probmoe.SubsetDistribution(torch.randn(3, 5), k=2, backend=backend)
    with pytest.raises(ValueError, match="sample_shape must be"):
        d.sample((-1,))
    for call in (lambda: d.sample(generator="x"), lambda: d.mean_and_sample("x")):
        with pytest.raises(ValueError, match="generator must be a torch.Generator"):
            call()


def test_log_prob_outside_the_support():
    d = probmoe.SubsetDistribution(torch.randn(6), kmin=2, kmax=3, backend="dp", validate_args=False)
    assert d.log_prob(torch.tensor([1.0, 0, 0, 0, 0, 0])).item() == -float("inf")
    checked = probmoe.SubsetDistribution(torch.randn(6), kmin=2, kmax=3, backend="dp")
    with pytest.raises(ValueError, match="support"):
        checked.log_prob(torch.tensor([1.0, 0, 0, 0, 0, 0]))


@pytest.mark.parametrize(
    "logits,kwargs,match",
    [
        (torch.randn(3, 6), dict(k=7), r"k must be in \[0, 6\]"),
        (torch.randn(3, 6), dict(k=-1), r"k must be in"),
        (torch.randn(3, 6), dict(kmin=4, kmax=3), "kmin must be <= kmax"),
        (torch.randn(3, 6), dict(kmin=1, kmax=9), r"kmax must be in \[0, 6\]"),
        (torch.randn(3, 6), dict(k=2, kmin=1), "either k .* or kmin/kmax"),
        (torch.randn(3, 6), dict(), "pass k"),
        (torch.randn(3, 6), dict(k=2.0), "k must be an integer"),
        (torch.tensor([[0.0, float("nan"), 1.0]]), dict(k=1), "NaN"),
        (torch.tensor([[0.0, float("inf"), 1.0]]), dict(k=1), r"\+inf"),
        (torch.tensor([[0.0, 1.0, 2.0], [0.0, -float("inf"), -float("inf")]]), dict(kmin=2, kmax=3), "infeasible"),
        (torch.arange(6), dict(k=2), "floating-point"),
        ([0.0, 1.0], dict(k=1), "torch.Tensor"),
        (torch.randn(3, 6), dict(k=2, backend="magic"), "backend must be"),
        (torch.randn(3, 6), dict(k=2, grad="straight"), "grad must be"),
    ],
)
def test_bad_input(logits, kwargs, match):
    with pytest.raises(ValueError, match=match):
        probmoe.SubsetDistribution(logits, **kwargs)


def test_validate_args_false_skips_the_value_checks():
    r = torch.tensor([[0.0, float("nan"), 1.0]])
    d = probmoe.SubsetDistribution(r, k=1, backend="dp", validate_args=False)
    assert d.mean.isnan().any()


def test_dp_keeps_only_the_logits_for_backward():
    saved = []
    r = torch.randn(512, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        m = probmoe.SubsetDistribution(r, kmin=4, kmax=8, backend="dp").mean
    assert sum(saved) <= r.numel() * 4
    m.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grad", ["exact", "paper"])
@pytest.mark.parametrize("kmin,kmax", [(3, 3), (2, 5)])
def test_mean_tangent_is_zero_with_the_gradient_of_the_mean(backend, grad, kmin, kmax):
    r = logits_for(7, kmin).double().requires_grad_()
    v = torch.randn(r.shape, dtype=torch.float64)
    d = probmoe.SubsetDistribution(r, kmin=kmin, kmax=kmax, backend=backend, grad=grad)
    (want,) = torch.autograd.grad((d.mean * v).sum(), r)
    for sample in (False, True):
        d = probmoe.SubsetDistribution(r, kmin=kmin, kmax=kmax, backend=backend, grad=grad)
        t, z = d.mean_tangent(sample, torch.Generator().manual_seed(0))
        assert torch.equal(t, torch.zeros_like(t)) and (z is None) == (not sample)
        if sample:
            assert bool(((z.sum(-1) >= kmin) & (z.sum(-1) <= kmax)).all())
        (got,) = torch.autograd.grad((t * v).sum(), r)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
