"""Exact ancestral sampling: chi-squared tests against brute-force subset probabilities."""

import pytest
import torch
from brute import exact, masks
from stats import chi2_pvalue, mask_counts

import circuits

DRAWS = 200_000


@pytest.mark.parametrize(
    "spec,cards,logits",
    [
        (circuits.ExactlyK(6, 3), [3], [0.3, -0.2, 1.0, 0.0, -1.1, 0.5]),
        (circuits.RangeK(6, 2, 4), range(2, 5), [0.8, -0.5, 1.5, -2.0, 0.1, 0.4]),
        (circuits.ExactlyK(5, 2), [2], [3.0, -2.5, 0.0, 1.5, -4.0]),  # skewed
    ],
)
def test_chi_squared(spec, cards, logits, device):
    r = torch.tensor(logits)
    c = circuits.compile_circuit(spec, device=device)
    draws = c.sample(r.to(device).expand(DRAWS, -1), generator=torch.Generator(device).manual_seed(1234)).cpu()
    gen = torch.Generator().manual_seed(1234)
    allowed = masks(spec.n, cards)
    probs = exact(r[None], allowed).probs[0]
    assert chi2_pvalue(mask_counts(draws, allowed), probs) > 1e-3
    # the chi-squared test must be able to fail: a wrong distribution is rejected
    wrong = torch.softmax(torch.randn(len(probs), generator=gen), 0)
    assert chi2_pvalue(mask_counts(draws, allowed), wrong) < 1e-6


def test_n64_every_draw_has_exactly_k_ones(device):
    c = circuits.compile_circuit(circuits.ExactlyK(64, 8), device=device)
    z = c.sample(torch.randn(4096, 64, device=device) * 3)
    assert z.dtype == torch.float32 and set(z.unique().tolist()) <= {0.0, 1.0}
    assert bool((z.sum(-1) == 8).all())


def test_range_draws_stay_in_range_and_match_marginals(device):
    c = circuits.compile_circuit(circuits.RangeK(64, 4, 8), device=device)
    r = torch.randn(64, dtype=torch.float64, device=device) - 2.0
    z = c.sample(r.expand(100_000, -1), generator=torch.Generator(device).manual_seed(0))
    k = z.sum(-1)
    assert bool(((k >= 4) & (k <= 8)).all()) and len(k.unique()) == 5
    m = c.marginals(r)
    assert (z.mean(0) - m).abs().max() < 5 * (m * (1 - m) / 100_000).sqrt().max()


def test_sampling_is_reproducible_and_avoids_minus_inf(device):
    c = circuits.compile_circuit(circuits.ExactlyK(10, 4), device=device)
    r = torch.randn(1000, 10, device=device)
    r[:, [1, 7]] = -torch.inf
    a = c.sample(r, generator=torch.Generator(device).manual_seed(5))
    b = c.sample(r, generator=torch.Generator(device).manual_seed(5))
    assert torch.equal(a, b)
    assert a[:, [1, 7]].sum() == 0 and bool((a.sum(-1) == 4).all())


def test_fused_marginals_and_sample(device):
    c = circuits.compile_circuit(circuits.RangeK(12, 2, 6), device=device)
    r = torch.randn(50, 12, device=device, requires_grad=True)
    m, z = c.marginals_and_sample(r, generator=torch.Generator(device).manual_seed(0))
    torch.testing.assert_close(m, c.marginals(r))
    assert not z.requires_grad and bool(((z.sum(-1) >= 2) & (z.sum(-1) <= 6)).all())
    v = torch.randn_like(m)
    (g1,) = torch.autograd.grad(m, r, v)
    (g2,) = torch.autograd.grad(c.marginals(r), r, v)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("spec", [circuits.ExactlyK(16, 5), circuits.RangeK(13, 3, 7)])
def test_nodes_a_draw_passes_through_have_distinct_uniforms(spec):
    """Sampling shares one uniform per vtree node: the active nodes of one draw must never share one."""
    from circuits.kernels import torch_passes as kernels

    c = circuits.compile_circuit(spec)
    prog, r = c.program, torch.randn(2000, spec.n) * 2
    act = kernels._descend(prog, kernels.upward(prog, r), lambda grp, a: _random_choice(prog, grp, a))
    ids, count = prog.scope_ids
    assert count < sum(g.nodes for g in prog.groups)  # the sharing is real
    for g in prog.groups:
        if g.fanin == 1:
            continue
        hits = torch.zeros(count, r.shape[0])
        hits.index_add_(0, ids[g.start], (act[g.slots] > 0).float())
        assert hits.max() <= 1  # within one group
    total = torch.zeros(count, r.shape[0])
    for g in prog.groups:
        if g.fanin > 1:
            total.index_add_(0, ids[g.start], (act[g.slots] > 0).float())
    assert total.max() <= 1 and total.sum() > 0


def _random_choice(prog, grp, a):
    """0/1 flows to a random live element of each active node (random walks of the circuit)."""
    live = (prog.prime[grp.rows] != circuits.layout.FALSE_SLOT).view(grp.nodes, grp.fanin, 1)
    score = torch.rand(grp.nodes, grp.fanin, a.shape[1]) * live  # dead elements score 0
    pick = torch.arange(grp.fanin).view(1, -1, 1) == score.argmax(dim=1, keepdim=True)
    return pick.float() * a.unsqueeze(1)
