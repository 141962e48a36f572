"""The routing contract (docs/router.md) for every backend, method and constraint, on the fused and
the composed path: within a row no expert id repeats (unused slots included), ids lie in 0..N-1,
unused slots carry weight exactly 0 (mask False, no gradient), the used slots come first, and the
shapes are [T, kmax]. The old padding (unused slots repeating slot 0's id) fails the first check."""

import pytest
import torch

import circuits
import probmoe
from circuits import GroupCapacity, GroupLimited

BACKENDS = ["circuit", "dp"]
METHODS = ["probmoe", "topk-marginal", "sample-dense-ste"]
SIZES = [dict(k=3), dict(kmin=1, kmax=5), dict(kmin=2, kmax=4), dict(kmin=1, kmax=12)]  # N = 12
CONSTRAINTS = [
    circuits.ExactlyK(12, 3),
    circuits.RangeK(12, 1, 5),
    GroupLimited(12, 3, 4, 2),
    GroupCapacity(12, None, 4, 2, kmin=2, kmax=5),
    GroupLimited(12, None, [2, 4, 6], 2, capacity=2, kmin=1, kmax=4),
]


def logits(dtype=torch.float32, T=257, N=12, seed=0):
    """[T, N] logits over several scales, with rows that make ranges use kmin and kmax, a row of -inf
    experts and one with tied values."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, N, generator=g, dtype=dtype) * torch.linspace(0.1, 6, T, dtype=dtype).unsqueeze(-1)
    r[0] = -5.0  # all negative: a range's MAP takes kmin
    r[1] = 5.0  # all positive: kmax
    r[2, 6:] = -torch.inf  # never routed to experts 6..11 (the unused slots may still name them)
    r[3] = 0.25  # ties
    return r


def check_contract(out: probmoe.Routing, N: int, kmax: int):
    T = out.indices.shape[0]
    assert out.indices.shape == out.weights.shape == out.mask.shape == (T, kmax)
    assert out.indices.dtype == torch.long and out.mask.dtype == torch.bool
    assert bool(((out.indices >= 0) & (out.indices < N)).all())
    ids = out.indices.sort(dim=-1).values
    assert bool((ids.diff(dim=-1) > 0).all()), "a row repeats an expert id"
    assert bool((out.weights[~out.mask] == 0).all()), "an unused slot has a nonzero weight"
    assert torch.equal(out.mask, torch.arange(kmax) < out.counts.unsqueeze(-1)), "the used slots come first"
    assert bool((out.counts >= out.config.kmin).all() and (out.counts <= kmax).all())
    # the used experts are the selection; the unused slots name experts the token does not use
    sel = out.selected()
    assert torch.equal(sel.sum(-1), out.counts)
    assert not bool(sel.gather(-1, out.indices)[~out.mask].any())


def check_no_gradient_through_unused(r: torch.Tensor, out: probmoe.Routing):
    if not out.weights.requires_grad:
        return
    c = torch.randn(out.weights.shape, generator=torch.Generator().manual_seed(1), dtype=out.weights.dtype)
    (g1,) = torch.autograd.grad((out.weights * c).sum(), r, retain_graph=True)
    (g2,) = torch.autograd.grad((out.weights * torch.where(out.mask, c, 0.0)).sum(), r)
    assert torch.equal(g1, g2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fused", "composed"])
@pytest.mark.parametrize("scores", ["softmax", "sigmoid"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("backend", BACKENDS)
def test_sizes_keep_the_contract(backend, sizes, method, scores, dtype):
    N = 12
    r = logits(dtype).requires_grad_()
    for training in (True, False):
        out = probmoe.route(
            r,
            training=training,
            backend=backend,
            method=method,
            scores=scores,
            generator=torch.Generator().manual_seed(3),
            **sizes,
        )
        check_contract(out, N, out.config.kmax)
        check_no_gradient_through_unused(r, out)
        if "kmin" in sizes and sizes["kmin"] < sizes["kmax"] and not training:
            assert out.counts[0] == sizes["kmin"] and out.counts[1] == sizes["kmax"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("spec", CONSTRAINTS, ids=str)
def test_constraints_keep_the_contract(spec, method, dtype):
    normalize = method == "probmoe"  # normalised weights too (unused slots stay 0)
    r = logits(dtype, T=97)
    r[2] = 0.0  # group constraints may exclude a row's only finite experts: no -inf row here
    r.requires_grad_()
    for training in (True, False):
        out = probmoe.route(
            r,
            constraint=spec,
            training=training,
            method=method,
            normalize=normalize,
            generator=torch.Generator().manual_seed(4),
        )
        check_contract(out, 12, out.config.kmax)
        check_no_gradient_through_unused(r, out)


def test_the_contract_is_what_the_fused_operator_returns():
    """``circuits::chosen_scores`` itself (the operator the fused route calls), DP and circuit, many
    draws of a wide range: distinct ids per row, the lowest undrawn ones ascending after the drawn."""
    r = logits(torch.float32, T=1000, N=40) - 1.0
    c = circuits.compile_circuit(circuits.RangeK(40, 1, 9))
    dp = circuits.CardinalityDP(circuits.RangeK(40, 1, 9))
    for handle in (dp.handle, c.handle):
        w, idx, mask, _ = torch.ops.circuits.chosen_scores(
            r, circuits.ops.seed(torch.Generator().manual_seed(5), r), 1, 9, handle, 9, "softmax", False
        )
        assert bool((idx.sort(dim=-1).values.diff(dim=-1) > 0).all()) and bool((w[~mask] == 0).all())
        assert (~mask).any()
        for t in range(0, 1000, 37):
            used = set(idx[t][mask[t]].tolist())
            rest = [i for i in range(40) if i not in used][: int((~mask[t]).sum())]
            assert idx[t][~mask[t]].tolist() == rest


def test_router_returns_the_contract():
    router = probmoe.ProbMoERouter(16, 12, kmin=1, kmax=6, generator=torch.Generator().manual_seed(0))
    x = torch.randn(5, 40, 16, generator=torch.Generator().manual_seed(1))
    for mode in (True, False):
        router.train(mode)
        _, w, idx = router(x)
        check_contract(router.last_routing, 12, 6)
        assert torch.equal(w, router.last_routing.weights) and torch.equal(idx, router.last_routing.indices)
