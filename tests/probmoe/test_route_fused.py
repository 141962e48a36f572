"""route(training=True) as one operator, ``circuits::chosen_scores`` (fp32 on the CPU with the C
kernels): the same draws, indices, weights, mask and scores as the composed path, bit for bit,
gradients to rounding, for every option the fused path takes; what its graph keeps; the composed
path where the C kernels are off. The operator itself: tests/circuits/test_chosen_scores.py."""

from __future__ import annotations

import importlib

import pytest
import torch
from hard_rows import hard_logits

import circuits
import probmoe

route_module = importlib.import_module("probmoe.route")


@pytest.mark.parametrize(
    "options",
    [dict(), dict(scores="sigmoid"), dict(normalize=True), dict(grad="paper")],
    ids=["softmax", "sigmoid", "normalize", "paper"],
)
@pytest.mark.parametrize("size", [dict(k=8), dict(kmin=4, kmax=8)], ids=["exactly", "range"])
@pytest.mark.parametrize("backend", ["dp", "circuit"])
def test_route_fused_equals_composed(backend, size, options, monkeypatch):
    """The same draws (same generator), indices, weights, mask and scores bit for bit; gradients to
    rounding."""
    r = hard_logits(500, 64, seed=11)
    g = torch.randn(500, 8, generator=torch.Generator().manual_seed(12))

    def routed():
        x = r.clone().requires_grad_()
        out = probmoe.route(
            x, **size, training=True, backend=backend, generator=torch.Generator().manual_seed(13), **options
        )
        (grad,) = torch.autograd.grad((out.weights * g).sum(), x)
        return out.indices, out.weights.detach(), out.mask, out.probs, grad

    fused = routed()
    monkeypatch.setattr(route_module, "_fused", lambda *a: False)
    composed = routed()
    for a, b in zip(fused[:4], composed[:4]):
        assert torch.equal(a, b)
    torch.testing.assert_close(fused[4], composed[4], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "options",
    [dict(), dict(scores="sigmoid"), dict(normalize=True), dict(grad="paper")],
    ids=["softmax", "sigmoid", "normalize", "paper"],
)
@pytest.mark.parametrize(
    "spec",
    [circuits.GroupLimited(16, 4, 4, 2), circuits.GroupCapacity(16, None, 4, 2, kmin=1, kmax=4)],
    ids=["limited", "capacity-range"],
)
def test_group_route_fused_equals_composed(spec, options, monkeypatch):
    """A group spec by its circuit's C passes: the fused route (one operator forward, one backward)
    gives the composed path's draws, indices, weights, mask and scores bit for bit, gradients to
    rounding; by the group DP's torch sweeps (no fused kernels there) the route composes."""
    r = hard_logits(300, 16, seed=5)
    g = torch.randn(300, spec.kmax, generator=torch.Generator().manual_seed(6))
    calls = []
    real = route_module._route_fused
    monkeypatch.setattr(route_module, "_route_fused", lambda *a: calls.append(1) or real(*a))

    def routed(algorithm="circuit"):
        x = r.clone().requires_grad_()
        gen = torch.Generator().manual_seed(7)
        out = probmoe.route(x, constraint=spec, training=True, algorithm=algorithm, generator=gen, **options)
        (grad,) = torch.autograd.grad((out.weights * g).sum(), x)
        return out.indices, out.weights.detach(), out.mask, out.probs, grad

    fused = routed()
    assert calls == [1]
    routed("dp")
    assert calls == [1]  # the torch sweeps: composed
    monkeypatch.setattr(route_module, "_fused", lambda *a: False)
    composed = routed()
    for a, b in zip(fused[:4], composed[:4]):
        assert torch.equal(a, b)
    torch.testing.assert_close(fused[4], composed[4], atol=1e-5, rtol=1e-4)


def test_route_saves_no_more_than_softmax_topk():
    """At T = 4096, N = 64, k = 8 the graph keeps the logits, int32 indices and the mask: 1.16 MiB,
    where softmax + top-k keeps 1.25 MiB."""
    r = torch.randn(4096, 64, requires_grad=True)

    def saved(fn) -> int:
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sum(seen.values())

    baseline = saved(lambda: torch.topk(torch.softmax(r, -1), 8).values)
    for backend in ("dp", "circuit"):
        assert saved(lambda: probmoe.route(r, k=8, training=True, backend=backend).weights) <= baseline


def test_route_composes_without_the_c_dp(c_dp_off):
    """Without the C DP route(backend="dp") keeps its composed path, with the same results."""
    r = torch.randn(64, 16)
    dist = probmoe.SubsetDistribution(r, k=4, backend="dp")
    assert not route_module._fused(dist, r, probmoe.RoutingConfig(num_experts=16, k=4, backend="dp"))
    out = probmoe.route(r.requires_grad_(), k=4, training=True, backend="dp")
    out.weights.sum().backward()
    assert out.mask.all() and r.grad.abs().sum() > 0
