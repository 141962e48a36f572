"""Exactness of the batched evaluator: brute force (n <= 12), pysdd's WMC (n = 64), the reference."""

import math

import pytest
import torch
import torch.nn.functional as F
from brute import exact, masks

import circuits
from circuits.kernels import by_node as reference

pytestmark = pytest.mark.usefixtures("float64")  # 1e-9 tolerances need float64 defaults

EXACT_SPECS = [(n, k) for n in range(1, 11) for k in range(n + 1)]
RANGE_SPECS = [
    (n, lo, hi)
    for n in range(1, 11)
    for lo, hi in {(0, n), (1, max(1, n - 1)), (n // 3, (2 * n) // 3), (0, 1), (n - 1, n)}
]


def _check(spec, cards, device, T=6, scale=2.0, seed=0):
    """The circuit on ``device`` against brute force on the CPU: r [T, n] float64."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, spec.n, generator=g, dtype=torch.float64) * scale
    c = circuits.compile_circuit(spec, device=device)
    want = exact(r, masks(spec.n, cards))
    rd = r.to(device)
    torch.testing.assert_close(c.log_partition(rd).cpu(), want.log_partition, atol=1e-9, rtol=0)
    torch.testing.assert_close(c.marginals(rd).cpu(), want.marginals, atol=1e-9, rtol=0)
    assert torch.equal(c.map(rd).cpu(), want.map)


@pytest.mark.parametrize("n,k", EXACT_SPECS)
def test_exactly_k_matches_brute_force(n, k, device):
    _check(circuits.ExactlyK(n, k), [k], device)


@pytest.mark.parametrize("n,lo,hi", sorted(RANGE_SPECS))
def test_range_k_matches_brute_force(n, lo, hi, device):
    _check(circuits.RangeK(n, lo, hi), range(lo, hi + 1), device)


@pytest.mark.parametrize("spec,cards", [(circuits.ExactlyK(12, 5), [5]), (circuits.RangeK(12, 3, 7), range(3, 8))])
def test_n12_matches_brute_force(spec, cards, device):
    _check(spec, cards, device, T=3)


@pytest.mark.parametrize(
    "spec,cards",
    [
        (circuits.ExactlyK(6, 3), [3]),
        (circuits.ExactlyK(8, 2), [2]),
        (circuits.RangeK(7, 2, 4), range(2, 5)),
        (circuits.RangeK(8, 0, 3), range(4)),
        (circuits.ExactlyK(5, 5), [5]),
    ],
)
def test_jacobian_of_marginals_is_covariance(spec, cards, device):
    r = torch.randn(spec.n) * 1.5
    c = circuits.compile_circuit(spec, device=device)
    jac = torch.autograd.functional.jacobian(c.marginals, r.to(device)).cpu()
    cov = exact(r[None], masks(spec.n, cards)).cov[0]
    torch.testing.assert_close(jac, cov, atol=1e-9, rtol=0)
    # log Z is twice differentiable: Hessian = Cov - diag(p (1 - p))
    p = torch.sigmoid(r)
    hess = torch.autograd.functional.hessian(c.log_partition, r.to(device)).cpu()
    torch.testing.assert_close(hess, cov - torch.diag(p * (1 - p)), atol=1e-9, rtol=0)


def _pysdd_wmc(spec, r):
    """log Z and marginals from pysdd's own weighted model counter (log mode)."""
    mgr, root = circuits.compile_sdd(spec)
    wmc = root.wmc(log_mode=True)
    for i in range(spec.n):
        wmc.set_literal_weight(mgr.literal(i + 1), float(F.logsigmoid(r[i])))
        wmc.set_literal_weight(mgr.literal(-(i + 1)), float(F.logsigmoid(-r[i])))
    log_z = wmc.propagate()
    m = [math.exp(wmc.literal_pr(mgr.literal(i + 1))) for i in range(spec.n)]
    return torch.tensor(log_z), torch.tensor(m)


@pytest.mark.parametrize("spec", [circuits.ExactlyK(64, 8), circuits.RangeK(64, 4, 8)])
def test_n64_matches_pysdd_wmc(spec, device):
    c = circuits.compile_circuit(spec, device=device)
    r = torch.randn(3, 64) * 2
    lz, m = c.log_partition(r.to(device)).cpu(), c.marginals(r.to(device)).cpu()
    for t in range(3):
        want_lz, want_m = _pysdd_wmc(spec, r[t])
        torch.testing.assert_close(lz[t], want_lz, atol=1e-9, rtol=1e-12)
        torch.testing.assert_close(m[t], want_m, atol=1e-9, rtol=0)
    if isinstance(spec, circuits.ExactlyK):
        torch.testing.assert_close(m.sum(-1), torch.full((3,), 8.0))


@pytest.mark.parametrize("spec", [circuits.ExactlyK(64, 8), circuits.RangeK(64, 4, 8), circuits.RangeK(20, 3, 9)])
def test_torch_passes_match_the_node_by_node_definition(spec):
    c = circuits.compile_circuit(spec)
    r = torch.randn(4, spec.n) * 2
    torch.testing.assert_close(c.log_partition(r), reference.log_partition(c.layout, r), atol=1e-10, rtol=0)
    torch.testing.assert_close(c.marginals(r), reference.marginals(c.layout, r).detach(), atol=1e-10, rtol=0)
    assert torch.equal(c.map(r), reference.map_assignment(c.layout, r))
    # the hand-written Cov(z) v backward against double backward through the reference
    rr = r.clone().requires_grad_()
    v = torch.randn_like(r)
    (got,) = torch.autograd.grad(c.marginals(rr), rr, v)
    (want,) = torch.autograd.grad(reference.marginals(c.layout, rr), rr, v)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_exactly_k_map_is_top_k(device):
    c = circuits.compile_circuit(circuits.ExactlyK(64, 8), device=device)
    r = torch.randn(200, 64, device=device)
    top = torch.zeros_like(r).scatter_(1, r.topk(8, dim=-1).indices, 1.0)
    assert torch.equal(c.map(r), top)


def test_range_k_map_rule(device):
    """Range MAP: the top clamp(#{r > 0}, kmin, kmax) logits."""
    c = circuits.compile_circuit(circuits.RangeK(64, 4, 8), device=device)
    r = torch.randn(300, 64) - 1.3  # about 6 positive logits per row, spread over the band
    z = c.map(r.to(device)).cpu()
    k = (r > 0).sum(-1).clamp(4, 8)
    assert set(k.tolist()) >= {4, 8} and torch.equal(z.sum(-1).long(), k)
    order = r.argsort(dim=-1, descending=True)
    want = torch.zeros_like(r)
    for t in range(len(r)):
        want[t, order[t, : k[t]]] = 1.0
    assert torch.equal(z, want)


def test_leading_dimensions_and_model_count():
    c = circuits.compile_circuit(circuits.RangeK(10, 2, 5))
    r = torch.randn(2, 3, 10)
    assert c.log_partition(r).shape == (2, 3)
    assert c.marginals(r).shape == c.sample(r).shape == c.map(r).shape == (2, 3, 10)
    assert c.layout.model_count() == sum(math.comb(10, j) for j in range(2, 6))
    big = circuits.compile_circuit(circuits.ExactlyK(64, 8))
    assert big.layout.model_count() == math.comb(64, 8) == int(big.info["model_count"])


def test_to_networkx_and_to_device():
    import networkx as nx

    c = circuits.compile_circuit(circuits.RangeK(6, 2, 4))
    G = c.to_networkx()
    kinds = [d["kind"] for _, d in G.nodes(data=True)]
    assert kinds.count("or") == c.sizes()["nodes"] and kinds.count("and") == c.sizes()["elements"]
    assert nx.is_directed_acyclic_graph(G)
    assert all(G.out_degree(a) == 2 for a, d in G.nodes(data=True) if d["kind"] == "and")
    r = torch.randn(3, 6)
    moved = c.to("cpu")
    torch.testing.assert_close(moved.marginals(r), c.marginals(r))
    assert "RangeK(n=6, kmin=2, kmax=4)" in repr(c)
