"""Numerics: shift invariance, huge and -inf logits, dtypes, and clear errors for bad input."""

import pytest
import torch
from brute import exact, masks

import circuits

K8 = circuits.ExactlyK(64, 8)
R48 = circuits.RangeK(64, 4, 8)


@pytest.mark.parametrize(
    "dtype,shift,tol",
    [
        (torch.float32, 30.0, 2e-5),
        (torch.float32, -30.0, 2e-5),
        (torch.float64, 1000.0, 1e-9),
        (torch.float64, -1000.0, 1e-9),
    ],
)
def test_exactly_k_marginals_are_shift_invariant(dtype, shift, tol):
    c = circuits.compile_circuit(K8)
    r = torch.randn(256, 64, dtype=dtype) * 2
    m0, m1 = c.marginals(r), c.marginals(r + shift)
    assert (m0 - m1).abs().max() < tol
    torch.testing.assert_close(m1.sum(-1), torch.full((256,), 8.0, dtype=dtype), atol=1e-4, rtol=0)
    assert torch.equal(c.map(r), c.map(r + shift))


@pytest.mark.parametrize("outlier", [1e4, 1e8, -1e8])
def test_one_far_outlier_keeps_the_others_precise(outlier):
    """Exactly-k shifts by the k-th largest logit, not the maximum, so one outlier costs nothing."""
    from circuits.kernels import by_node as reference

    c = circuits.compile_circuit(circuits.ExactlyK(16, 4))
    r = torch.randn(8, 16, dtype=torch.float64)
    r[:, 0] = outlier
    want = reference.marginals(c.layout, r).detach()
    got = c.marginals(r.float()).double()
    assert ((got - want).abs() / want.clamp_min(1e-6)).max() < 1e-5


def test_fp32_agrees_with_fp64():
    for spec in (K8, R48):
        c = circuits.compile_circuit(spec)
        r = torch.randn(512, 64, dtype=torch.float64) * 3
        m32, m64 = c.marginals(r.float()), c.marginals(r)
        assert (m32.double() - m64).abs().max() < 1e-5
        assert (c.log_partition(r.float()).double() - c.log_partition(r)).abs().max() < 1e-5 * c.log_partition(
            r
        ).abs().max()


@pytest.mark.parametrize("spec,cards", [(circuits.ExactlyK(8, 3), [3]), (circuits.RangeK(8, 2, 5), range(2, 6))])
def test_huge_logits_are_finite_and_correct(spec, cards):
    c = circuits.compile_circuit(spec)
    g = torch.Generator().manual_seed(0)
    r = torch.randn(20, 8, generator=g, dtype=torch.float64) * 1e4
    r[:4] = 1e4 + torch.randn(4, 8, generator=g, dtype=torch.float64)  # nearly tied huge logits
    want = exact(r, masks(8, cards))
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 2e-3)):
        x = r.to(dtype).requires_grad_()
        lz, m = c.log_partition(x), c.marginals(x)
        (grad,) = torch.autograd.grad(lz.sum() + (m * torch.randn_like(m)).sum(), x)
        assert torch.isfinite(lz).all() and torch.isfinite(m).all() and torch.isfinite(grad).all()
        assert (m.double() - want.marginals).abs().max() < tol
        assert ((lz.double() - want.log_partition).abs() / want.log_partition.abs().clamp_min(1)).max() < tol
        assert torch.equal(c.map(x.detach()).double(), want.map)


@pytest.mark.parametrize("spec", [K8, R48, circuits.RangeK(64, 0, 64), circuits.ExactlyK(64, 0)])
def test_extreme_values_give_no_nan_or_inf(spec):
    c = circuits.compile_circuit(spec)
    r = torch.randn(6, 64) * 5
    r[0, :50] = -torch.inf  # 14 left: still feasible
    r[1] = torch.linspace(-1e4, 1e4, 64)
    r[2, ::2] = -torch.inf
    r[3] = 88.0  # exp overflows fp32
    r[4] = -104.0  # sigmoid underflows fp32
    r[5, 8:] = -torch.inf  # exactly 8 finite: the only feasible set for k = 8
    x = r.clone().requires_grad_()
    lz, m = c.log_partition(x), c.marginals(x)
    z, mode = c.sample(r), c.map(r)
    v = torch.randn_like(m)
    (grad,) = torch.autograd.grad(lz.sum() + (m * v).sum(), x)
    for t in (m, z, mode, grad):
        assert torch.isfinite(t).all()
    assert torch.isfinite(lz).all()
    assert (m[r == -torch.inf] == 0).all() and (z[r == -torch.inf] == 0).all() and (mode[r == -torch.inf] == 0).all()
    assert (grad[r == -torch.inf] == 0).all()
    if spec == K8:
        assert torch.equal(m[5], (r[5] > -torch.inf).float()) and torch.equal(z[5], m[5])


def test_half_precision_is_computed_in_fp32():
    c = circuits.compile_circuit(K8)
    r = torch.randn(64, 64)
    for dtype in (torch.float16, torch.bfloat16):
        x = r.to(dtype)
        m = c.marginals(x)
        assert m.dtype == dtype
        torch.testing.assert_close(m.float(), c.marginals(x.float()), atol=1e-2, rtol=0)
        assert c.sample(x).dtype == dtype and bool((c.sample(x).sum(-1) == 8).all())


def test_bad_input_raises_clear_errors():
    c = circuits.compile_circuit(circuits.RangeK(6, 2, 4))
    with pytest.raises(ValueError, match="NaN"):
        c.marginals(torch.tensor([0.0, float("nan"), 0, 0, 0, 0]))
    free = circuits.compile_circuit(circuits.RangeK(6, 0, 6))  # every variable implicit: log Z never sees r
    for query in (free.marginals, free.log_partition, free.sample, free.map):
        with pytest.raises(ValueError, match="NaN"):
            query(torch.tensor([float("nan"), 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"\+inf"):
        c.sample(torch.tensor([0.0, float("inf"), 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"\+inf"):  # exactly-k shifts by the row max first
        circuits.compile_circuit(circuits.ExactlyK(6, 2)).marginals(torch.tensor([0.0, float("inf"), 0, 0, 0, 0]))
    for query in (c.log_partition, c.marginals, c.sample, c.map):
        with pytest.raises(ValueError, match="unsatisfiable.*at least 2"):
            query(torch.tensor([[0.0] * 6, [0.0] + [-float("inf")] * 5]))
    with pytest.raises(ValueError, match=r"shape \[\.\.\., n\] with n = 6"):
        c.map(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="floating-point"):
        c.marginals(torch.zeros(3, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="k must be in \\[0, n = 4\\], got 5"):
        circuits.ExactlyK(4, 5)
    with pytest.raises(ValueError, match="kmin must be in \\[0, kmax = 2\\], got 3"):
        circuits.RangeK(6, 3, 2)
    with pytest.raises(ValueError, match="n must be in"):
        circuits.ExactlyK(0, 0)
    with pytest.raises(ValueError, match="k must be an integer"):
        circuits.ExactlyK(4, 1.5)
    with pytest.raises(ValueError, match="spec must be"):
        circuits.compile_circuit(42)
    with pytest.raises(ValueError, match="generator must be a torch.Generator on cpu"):
        c.sample(torch.zeros(6), generator=42)


def test_empty_batch():
    c = circuits.compile_circuit(K8)
    r = torch.zeros(0, 64)
    assert c.log_partition(r).shape == (0,) and c.marginals(r).shape == c.sample(r).shape == (0, 64)


def test_inference_mode_then_autograd_in_a_fresh_thread():
    """Scratch buffers first made under inference_mode must not leak into ordinary calls."""
    import threading

    errors = []

    def run():
        try:
            c = circuits.compile_circuit(circuits.RangeK(16, 2, 5))
            r = torch.randn(32, 16)
            with torch.inference_mode():
                c.marginals(r), c.sample(r), c.map(r)
            x = r.clone().requires_grad_()
            m, _ = c.marginals_and_sample(x)
            (m.sum() + c.log_partition(x).sum()).backward()
            c.map(r)
        except Exception as exc:  # reported to the main thread
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors


@pytest.mark.parametrize("spec", [circuits.ExactlyK(1, 1), circuits.RangeK(1, 0, 1), circuits.ExactlyK(8, 3)])
def test_no_query_writes_into_the_logits(spec):
    """The passes work in place on their own buffers; a [T, 1] input (whose transpose is
    contiguous) must not become one of them."""
    c = circuits.compile_circuit(spec)
    r = torch.randn(16, spec.n, requires_grad=True)
    before = r.detach().clone()
    c.log_partition(r).sum().backward()
    c.marginals(r).sum().backward()
    c.sample(r.detach())
    c.map(r.detach())
    assert torch.equal(r.detach(), before)
