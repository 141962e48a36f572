"""route(): straight-through training weights (Eq. 7 / Eq. 8), MAP at eval, ablations, edge cases."""

import threading

import pytest
import torch
from brute import exact, masks
from stats import chi2_pvalue, mask_counts

import probmoe

BACKENDS = ["dp", "circuit"]
SIZES = [dict(k=3), dict(kmin=2, kmax=5)]


def bounds(size):
    return (size["k"], size["k"]) if "k" in size else (size["kmin"], size["kmax"])


def dense(routing, slot_values):
    """Scatter per-slot values [T, kmax] of the used slots onto the experts: -> [T, N]."""
    v = torch.where(routing.mask, slot_values, 0.0)
    return torch.zeros_like(routing.probs).scatter_add_(-1, routing.indices, v)


def softmax_vjp(pi, v):
    """J_softmax^T v = pi ⊙ (v - pi·v): [T, N]."""
    return pi * (v - (pi * v).sum(-1, keepdim=True))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grad", ["exact", "paper"])
@pytest.mark.parametrize("size", SIZES)
def test_training_forward_and_eq8_gradient(backend, grad, size, device):
    g = torch.Generator().manual_seed(0)
    r = (torch.randn(64, 8, generator=g, dtype=torch.float64) * 2).to(device).requires_grad_()
    c = torch.randn(64, bounds(size)[1], generator=g, dtype=torch.float64).to(device)
    out = probmoe.route(
        r, **size, training=True, generator=torch.Generator(device).manual_seed(0), backend=backend, grad=grad
    )
    pi = torch.softmax(r.detach(), -1)
    # forward: exactly softmax at the drawn experts, 0 on unused slots
    torch.testing.assert_close(out.weights, torch.where(out.mask, pi.gather(-1, out.indices), 0.0), atol=1e-12, rtol=0)
    assert (out.weights[~out.mask] == 0).all()
    z = out.selected()
    kmin, kmax = bounds(size)
    assert ((z.sum(-1) >= kmin) & (z.sum(-1) <= kmax)).all() and torch.equal(out.counts, z.sum(-1))
    # backward: J_pi^T c + J_m^T (c ⊙ pi) with J_m = Cov (exact) or Cov diag(1 - p) (paper), Eq. 8
    (got,) = torch.autograd.grad((out.weights * c).sum(), r)
    ex = exact(r.detach().cpu(), masks(8, range(kmin, kmax + 1)))  # brute force on the CPU
    cd = dense(out, c)
    u = torch.einsum("tij,tj->ti", ex.cov.to(device), cd * pi)
    if grad == "paper":
        u = u * torch.sigmoid(-r.detach())
    torch.testing.assert_close(got, softmax_vjp(pi, cd) + u, atol=1e-10, rtol=0)
    torch.testing.assert_close(out.marginals, ex.marginals.to(device), atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_normalize_is_hf_norm_topk_prob_with_the_straight_through_gradient(backend):
    g = torch.Generator().manual_seed(1)
    r = torch.randn(32, 8, generator=g, dtype=torch.float64).requires_grad_()
    out = probmoe.route(r, kmin=2, kmax=5, training=True, generator=g, normalize=True, backend=backend)
    pi = torch.softmax(r, -1)
    used = torch.where(out.mask, pi.gather(-1, out.indices), 0.0)
    torch.testing.assert_close(out.weights, used / used.sum(-1, keepdim=True), atol=1e-12, rtol=0)
    # reference: Eq. 7 with brute-force marginals, then renormalised, on the same drawn slots
    m = exact(r, masks(8, range(2, 6))).marginals
    s = m.gather(-1, out.indices)
    w = torch.where(out.mask, pi.gather(-1, out.indices) * (1 + s - s.detach()), 0.0)
    ref = w / w.sum(-1, keepdim=True)
    c = torch.randn(32, 5, generator=g, dtype=torch.float64)
    (got,) = torch.autograd.grad((out.weights * c).sum(), r)
    (want,) = torch.autograd.grad((ref * c).sum(), r)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    ev = probmoe.route(r.detach(), k=3, training=False, normalize=True)
    top = torch.topk(pi.detach(), 3).values
    torch.testing.assert_close(ev.weights, top / top.sum(-1, keepdim=True), atol=0, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ablation_methods(backend):
    g = torch.Generator().manual_seed(2)
    r = torch.randn(64, 8, generator=g, dtype=torch.float64).requires_grad_()
    c = torch.randn(64, 5, generator=g, dtype=torch.float64)
    pi = torch.softmax(r.detach(), -1)
    cov = exact(r.detach(), masks(8, range(2, 6))).cov
    # topk-marginal: the MAP subset forward, the marginals backward
    out = probmoe.route(r, kmin=2, kmax=5, training=True, method="topk-marginal", backend=backend)
    ev = probmoe.route(r.detach(), kmin=2, kmax=5, training=False, backend=backend)
    assert torch.equal(out.indices, ev.indices) and torch.equal(out.mask, ev.mask)
    torch.testing.assert_close(out.weights, ev.weights, atol=0, rtol=0)
    (got,) = torch.autograd.grad((out.weights * c).sum(), r)
    cd = dense(out, c)
    torch.testing.assert_close(got, softmax_vjp(pi, cd) + torch.einsum("tij,tj->ti", cov, cd * pi), atol=1e-10, rtol=0)
    # sample-dense-ste: the drawn subset forward, z ≈ softmax(r) backward
    out = probmoe.route(r, kmin=2, kmax=5, training=True, method="sample-dense-ste", generator=g, backend=backend)
    torch.testing.assert_close(out.weights, torch.where(out.mask, pi.gather(-1, out.indices), 0.0), atol=1e-12, rtol=0)
    (got,) = torch.autograd.grad((out.weights * c).sum(), r)
    cd = dense(out, c)
    torch.testing.assert_close(got, softmax_vjp(pi, cd * (1 + pi)), atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "size,row",
    [(dict(k=3), [0.3, -0.2, 1.0, 0.0, -1.1, 0.5]), (dict(kmin=1, kmax=4), [0.8, -0.5, 1.5, -2.0, 0.1, -0.4])],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # float32 runs the circuit's C passes
def test_chi_squared_of_training_draws(backend, size, row, dtype, device):
    r = torch.tensor(row, dtype=dtype)
    out = probmoe.route(
        r.to(device).expand(40_000, 6),
        **size,
        training=True,
        generator=torch.Generator(device).manual_seed(3),
        backend=backend,
    )
    kmin, kmax = bounds(size)
    allowed = masks(6, range(kmin, kmax + 1))
    probs = exact(r[None].double(), allowed).probs[0]
    assert chi2_pvalue(mask_counts(out.selected().double().cpu(), allowed), probs) > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_exact_k_is_softmax_topk(backend, device):
    r = torch.randn(512, 64, device=device) * 2
    out = probmoe.route(r, k=8, training=False, backend=backend)
    vals, idx = torch.topk(torch.softmax(r, -1), 8)
    assert torch.equal(out.indices, idx) and torch.equal(out.weights, vals) and out.mask.all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_range_is_the_map(backend):
    r = torch.randn(256, 10, dtype=torch.float64) * 1.5
    out = probmoe.route(r, kmin=2, kmax=6, training=False, backend=backend)
    assert torch.equal(out.counts, (r > 0).sum(-1).clamp(2, 6))
    ex = exact(r, masks(10, range(2, 7)))
    assert torch.equal(out.selected().double(), ex.map)
    pi = torch.softmax(r, -1)
    assert torch.equal(out.weights, torch.where(out.mask, pi.gather(-1, out.indices), 0.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_range_does_not_tie_probabilities_that_underflow(backend):
    r = torch.tensor([[100.0, -2000.0, -1000.0], [100.0, -1000.0, -2000.0]])  # probabilities 1, 0, 0
    out = probmoe.route(r, kmin=2, kmax=3, training=False, backend=backend)
    assert torch.equal(out.selected(), torch.tensor([[True, False, True], [True, True, False]]))
    assert torch.equal(out.selected().float(), out.distribution.mode)
    assert out.indices.tolist() == [[0, 2, 1], [0, 1, 2]]  # the unused slot: the next expert by logit


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_k_routing_is_shift_invariant(backend):
    r = torch.randn(128, 16, dtype=torch.float64)
    for training in (True, False):
        a = probmoe.route(r, k=4, training=training, generator=torch.Generator().manual_seed(4), backend=backend)
        b = probmoe.route(
            r + 17.25, k=4, training=training, generator=torch.Generator().manual_seed(4), backend=backend
        )
        assert torch.equal(a.indices, b.indices)
        torch.testing.assert_close(a.weights, b.weights, atol=1e-12, rtol=0)
        torch.testing.assert_close(a.marginals, b.marginals, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [dict(k=4), dict(kmin=2, kmax=6)])
def test_sixty_experts(backend, size):
    r = (torch.randn(300, 60) * 2).requires_grad_()
    for training in (True, False):
        out = probmoe.route(r, **size, training=training, backend=backend)
        kmin, kmax = bounds(size)
        assert out.indices.shape == (300, kmax) and out.indices.max() < 60
        assert ((out.counts >= kmin) & (out.counts <= kmax)).all()
        (out.weights.sum() + out.marginals.sum()).backward()
        assert torch.isfinite(r.grad).all()
        r.grad = None


@pytest.mark.parametrize("backend", BACKENDS)
def test_neg_inf_logits_are_never_chosen(backend):
    g = torch.Generator().manual_seed(5)
    r = torch.randn(2000, 16, generator=g)
    r[torch.rand(2000, 16, generator=g) < 0.5] = -torch.inf
    r[:, :6] = torch.randn(2000, 6, generator=g)  # at least 6 live experts per token
    r[0] = torch.tensor([0.0, 1.0, 2.0, -1e4] + [-torch.inf] * 12)  # a live expert with softmax 0
    for size in (dict(k=4), dict(kmin=2, kmax=6)):
        for training in (True, False):
            out = probmoe.route(r, **size, training=training, generator=g, backend=backend)
            assert torch.isfinite(r.gather(-1, out.indices)[out.mask]).all()
    out = probmoe.route(r[:1], k=4, training=False, backend=backend)
    assert sorted(out.indices[0].tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unused_slots_carry_no_gradient(backend):
    r = torch.randn(64, 12, requires_grad=True)
    out = probmoe.route(r, kmin=1, kmax=8, training=True, generator=torch.Generator().manual_seed(6), backend=backend)
    assert not out.mask.all()  # some slots unused
    c = torch.randn(64, 8)
    (g1,) = torch.autograd.grad((out.weights * c).sum(), r, retain_graph=True)
    (g2,) = torch.autograd.grad((out.weights * torch.where(out.mask, c, 0.0)).sum(), r)
    assert torch.equal(g1, g2)
    assert (out.indices.sort(dim=-1).values.diff(dim=-1) > 0).all()  # the contract: no row repeats an expert


@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_mode_first(backend):
    """Buffers first made under inference_mode must not leak into training (run in a fresh thread:
    workspaces are per thread)."""
    errors = []

    def run():
        try:
            r = torch.randn(64, 16)
            with torch.inference_mode():
                probmoe.route(r, kmin=2, kmax=4, training=True, backend=backend)
            x = r.clone().requires_grad_()
            probmoe.route(x, kmin=2, kmax=4, training=True, backend=backend).weights.sum().backward()
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors


def test_no_grad_inference_mode_and_half_precision():
    r = torch.randn(64, 16)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            for training in (True, False):
                out = probmoe.route(r, kmin=2, kmax=4, training=training)
                assert out.weights.shape == (64, 4)
    out = probmoe.route(r, kmin=2, kmax=4, training=True)  # after inference mode: fresh buffers work
    for dtype in (torch.bfloat16, torch.float16):
        out = probmoe.route(r.to(dtype), k=3, training=False)
        assert out.weights.dtype == torch.float32
        assert torch.equal(out.indices, torch.topk(torch.softmax(r.to(dtype).float(), -1), 3).indices)


@pytest.mark.parametrize("kmin,kmax", [(8, 8), (4, 8)])
def test_saved_for_backward_is_small(kmin, kmax):
    """At most 2 KiB per token (8 MiB at T = 4096) held for the backward of route(training=True)."""
    r = torch.randn(1024, 64, requires_grad=True)
    seen = {}

    def pack(t):
        seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = probmoe.route(r, kmin=kmin, kmax=kmax, training=True)
    assert sum(seen.values()) <= 2048 * 1024
    out.weights.sum().backward()


@pytest.mark.parametrize(
    "logits,kwargs,match",
    [
        (torch.randn(4, 6), dict(k=0), r"k must be in \[1, 6\]"),
        (torch.randn(4, 6), dict(k=7), r"k must be in \[1, 6\]"),
        (torch.randn(4, 6), dict(kmin=5, kmax=4), "kmin must be <= kmax"),
        (torch.randn(4, 6), dict(kmin=0, kmax=4), r"kmin must be in \[1, 6\]"),
        (torch.randn(4, 6), dict(k=2, kmax=4), "either k"),
        (torch.randn(2, 4, 6), dict(k=2), "2-D"),
        (torch.randn(6), dict(k=2), "2-D"),
        (torch.tensor([[0.0, float("nan")]]), dict(k=1), "NaN"),
        (torch.tensor([[0.0, -float("inf"), -float("inf")]]), dict(kmin=2, kmax=3), "infeasible"),
        (torch.randn(4, 6), dict(k=2, method="dense"), "method must be"),
        (torch.randn(4, 6), dict(k=2, generator="x"), "generator must be a torch.Generator"),
        (torch.randn(4, 6), dict(kmin=1, kmax=3, generator=1), "generator must be a torch.Generator"),
    ],
)
def test_bad_input(logits, kwargs, match):
    with pytest.raises(ValueError, match=match):
        probmoe.route(logits, training=True, **kwargs)
    with pytest.raises(ValueError, match="training must be True or False"):
        probmoe.route(torch.randn(4, 6), k=2, training=None)


@pytest.mark.parametrize("backend", ["circuit", "dp"])
def test_nan_logits_without_validation_still_route_to_real_experts(backend):
    """validate_args=False skips the NaN check (garbage in, garbage out), but a NaN row must not
    reach past the experts: its drawn experts' probabilities are NaN, which the chosen top-k once
    left as unwritten slots (indices like 1.4e14 and an index error in the gate weights)."""
    r = torch.randn(300, 64, generator=torch.Generator().manual_seed(0))
    r[::3, 5] = float("nan")
    out = probmoe.route(
        r, k=8, training=True, backend=backend, validate_args=False, generator=torch.Generator().manual_seed(1)
    )
    assert out.indices.min() >= 0 and out.indices.max() < 64
    assert (out.counts[1::3] == 8).all()  # rows without a NaN are routed as usual
