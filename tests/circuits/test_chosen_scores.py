"""``circuits::chosen_scores`` (one draw, the drawn variables by score, Eq. 7's straight-through
weights) and its backward against the plain-torch reference ``circuits.kernels.straight_through.reference``:
the fused C DP and the composed kernels (the circuit's passes), values bit for bit, gradients
against brute force and against the torch DP's Cov(z) v in float64, draw frequencies (χ²).
``route``'s use of it: tests/probmoe/test_route_fused.py."""

from __future__ import annotations

import pytest
import torch
from brute import exact, masks
from hard_rows import hard_logits
from stats import chi2_pvalue, mask_counts

import circuits
from circuits.kernels import c_dp, straight_through, torch_dp

KINDS = ["softmax", "sigmoid"]


ALIVE = []  # an operator's handle is valid while its evaluator lives


def handle(backend: str, kmin: int, kmax: int, n: int) -> int:
    """The ``circuit`` argument for ``backend``: the handle of a DP's evaluator or of a compiled circuit."""
    spec = circuits.ExactlyK(n, kmin) if kmin == kmax else circuits.RangeK(n, kmin, kmax)
    ALIVE.append(circuits.CardinalityDP(spec) if backend == "dp" else circuits.compile_circuit(spec))
    return ALIVE[-1].handle


def draw(r: torch.Tensor, seed: torch.Tensor, kmin: int, kmax: int, circuit: int) -> torch.Tensor:
    """The draw the composed path makes from ``seed``: [T, N] (the DP's, or the circuit's)."""
    c = circuits.ops.evaluator(circuit)
    if isinstance(c, circuits.CardinalityDP):
        return torch.ops.circuits.dp_marginals(r, seed, kmin, kmax, False)[1]
    return torch.ops.circuits.sample(r, c._shift(r), seed, circuit)[0]


def dense(idx: torch.Tensor, mask: torch.Tensor, x: torch.Tensor, n: int) -> torch.Tensor:
    """Per-slot values x [T, slots] of the used slots onto their variables: [T, n]."""
    return torch.zeros(idx.shape[0], n, dtype=x.dtype).scatter_add_(-1, idx, torch.where(mask, x, 0.0))


def expected_grad(r, idx, mask, g, kind, paper, cov_vec):
    """The gradient of Σ g ⊙ weights by its formula: π's backward of the scattered g, plus
    J (g ⊙ π at the drawn), J = Cov(z) (times diag(1 - sigmoid(r)) with ``paper``); float64."""
    r = r.double()
    p = straight_through.scores(r, kind)
    cd = dense(idx, mask, g.double(), r.shape[1])
    g_t = cd * p
    own = g_t - p * g_t.sum(-1, keepdim=True) if kind == "softmax" else g_t * (1 - p)
    cov = cov_vec(torch.where(r > -torch.inf, r, -1e30), g_t)
    return own + (cov * torch.sigmoid(-r) if paper else cov)


def run(r, seed, kmin, kmax, circuit, kind, paper, g):
    """The operator's outputs and the gradient of Σ g ⊙ weights."""
    rr = r.clone().requires_grad_()
    w, idx, mask, p = torch.ops.circuits.chosen_scores(rr, seed, kmin, kmax, circuit, kmax, kind, paper)
    (grad,) = torch.autograd.grad((w * g).sum(), rr)
    return w.detach(), idx, mask, p, grad


# --- the forward: the reference, bit for bit ---------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,kmin,kmax", [(64, 8, 8), (64, 4, 8), (256, 16, 16), (10, 0, 3), (5, 5, 5)])
def test_c_dp_forward_is_the_reference(c_dp_built, n, kmin, kmax, kind):
    """The fused C pass (draw and selection in one) against the reference on the composed path's
    draw from the same seed: the same draw, order, weights and mask; T = 300 ends in a part tile."""
    r = hard_logits(300, n)
    r[1, 0] = 0.5  # a tie among the rest: the lower index first
    seed = circuits.ops.seed(torch.Generator().manual_seed(4), r)
    dp = handle("dp", kmin, kmax, n)
    got = torch.ops.circuits.chosen_scores(r, seed, kmin, kmax, dp, kmax, kind, False)
    want = straight_through.reference(r, draw(r, seed, kmin, kmax, dp), torch.zeros_like(r), kmax, kind)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
    if kmin == 0:
        assert not got[2][4].any() and torch.equal(got[1][4], torch.arange(kmax))  # nothing drawn: 0, 1, ...


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spec", [circuits.ExactlyK(12, 4), circuits.RangeK(12, 1, 5)], ids=str)
def test_circuit_forward_is_the_reference(spec, kind):
    c = circuits.compile_circuit(spec)
    kmin, kmax = spec.cardinalities[0], spec.cardinalities[-1]
    r = hard_logits(50, 12)
    seed = circuits.ops.seed(torch.Generator().manual_seed(1), r)
    got = torch.ops.circuits.chosen_scores(r, seed, kmin, kmax, c.handle, kmax, kind, False)
    want = straight_through.reference(r, draw(r, seed, kmin, kmax, c.handle), torch.zeros_like(r), kmax, kind)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


# --- the backward ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("paper", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kmin,kmax", [(3, 3), (1, 4)])
@pytest.mark.parametrize("backend", ["dp", "circuit"])
def test_gradient_is_brute_force(backend, kmin, kmax, kind, paper):
    """n = 7: the gradient against the enumerated Cov(z), for the C DP (fused backward, or its
    composed one with ``paper``) and the circuit's passes."""
    r = torch.randn(40, 7, generator=torch.Generator().manual_seed(2)) * 2
    r[0, 1] = -torch.inf
    circuit = handle(backend, kmin, kmax, 7)
    g = torch.randn(40, kmax, generator=torch.Generator().manual_seed(3))
    w, idx, mask, p, grad = run(r, circuits.ops.seed(None, r), kmin, kmax, circuit, kind, paper, g)
    cov = exact(r.double(), masks(7, range(kmin, kmax + 1))).cov
    want = expected_grad(r, idx, mask, g, kind, paper, lambda _, v: torch.einsum("tij,tj->ti", cov, v))
    torch.testing.assert_close(grad.double(), want, atol=2e-6, rtol=1e-5)
    assert grad[0, 1] == 0  # a -inf logit gets no gradient
    assert torch.equal(w, torch.where(mask, p.gather(-1, idx), 0.0))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,kmin,kmax", [(64, 8, 8), (64, 4, 8), (256, 16, 16), (10, 0, 3)])
@pytest.mark.parametrize("backend", ["dp", "circuit"])
def test_c_gradient_is_the_torch_dp_in_float64(c_dp_built, c_passes_built, backend, n, kmin, kmax, kind):
    """The fused C backward of the DP or of the circuit passes (scores, g_t, Cov(z) g_t, the
    scores' backward in one pass) against the
    formula with the torch DP's Cov(z) v in float64, on the hard rows, relative to each row's largest
    entry: within 1e-4, what the C DP's Cov(z) v in float32 reaches (3.5e-5 seen on these rows). At
    a score near 1 (the row at scale 100) the fused softmax backward avoids the cancellation the
    composed float32 one has (1.4e-7 there, where the composed path is off by 3.8e-5)."""
    r = hard_logits(300, n, seed=5)
    g = torch.randn(300, kmax, generator=torch.Generator().manual_seed(6))
    seed = circuits.ops.seed(torch.Generator().manual_seed(7), r)
    _, idx, mask, _, grad = run(r, seed, kmin, kmax, handle(backend, kmin, kmax, n), kind, False, g)
    want = expected_grad(r, idx, mask, g, kind, False, lambda x, v: torch_dp.cov_vec(x, v, kmin, kmax))
    scale = want.abs().amax(-1, keepdim=True).clamp_min(1e-3)
    torch.testing.assert_close(grad.double() / scale, want / scale, atol=1e-4, rtol=0)
    if kind == "softmax" and n == 256:
        assert ((grad.double() - want)[2] / scale[2]).abs().max() < 1e-6  # the row at scale 100


def test_backward_operator_equals_its_composed_form(c_dp_built):
    """The C DP's one-pass backward and the composed one (the torch scatter, the C Cov(z) v and the
    scores' backward) agree to rounding."""
    r = hard_logits(200, 64, seed=7)
    seed = circuits.ops.seed(None, r)
    w, idx, mask, _ = torch.ops.circuits.chosen_scores(r, seed, 4, 8, handle("dp", 4, 8, 64), 8, "softmax", False)
    g = torch.randn(200, 8, generator=torch.Generator().manual_seed(8))
    fused = c_dp.chosen_scores_backward(r, idx, mask, g, 4, 8, False)
    p = torch.softmax(r, -1)
    g_t = dense(idx, mask, g, 64) * p
    composed = c_dp.cov_vec(r, g_t, 4, 8) + (g_t - p * g_t.sum(-1, keepdim=True))
    torch.testing.assert_close(fused, composed, atol=1e-6, rtol=1e-5)


# --- the draw -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(3, 3), (1, 4)])
@pytest.mark.parametrize("backend", ["dp", "circuit"])
def test_draw_frequencies(backend, size):
    kmin, kmax = size
    row = torch.tensor([0.3, -0.2, 1.0, 0.0, -1.1, 0.5])
    r = row.expand(40_000, 6).contiguous()
    seed = circuits.ops.seed(torch.Generator().manual_seed(9), r)
    _, idx, mask, _ = torch.ops.circuits.chosen_scores(
        r, seed, kmin, kmax, handle(backend, kmin, kmax, 6), kmax, "softmax", False
    )
    chosen = dense(idx, mask, torch.ones(idx.shape), 6)
    allowed = masks(6, range(kmin, kmax + 1))
    assert chi2_pvalue(mask_counts(chosen, allowed), exact(row[None].double(), allowed).probs[0]) > 1e-3
