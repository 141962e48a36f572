"""GateWeights (the fused Eq. 7 weights) against its plain-torch reference: values and gradients."""

import pytest
import torch

from probmoe.gate_weights import GateWeights, reference


@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_value_and_gradients_equal_the_reference(kind, float64):
    g = torch.Generator().manual_seed(0)
    T, N, kmax = 7, 10, 4
    r = torch.randn(T, N, generator=g) * 3
    r[0, 3] = -torch.inf  # a never-routed expert
    idx = torch.stack([torch.randperm(N, generator=g)[:kmax] for _ in range(T)])
    idx[0] = torch.tensor([0, 1, 2, 4])
    mask = torch.rand(T, kmax, generator=g) < 0.7
    mask[:, 0] = True
    base = torch.randn(T, N, generator=g)
    gw = torch.randn(T, kmax, generator=g)

    def grads(fn):
        rr = r.clone().requires_grad_()
        b = base.clone().requires_grad_()
        t = b * rr.tanh() - (b * rr.tanh()).detach()  # zero-valued tangent with a graph to r and to b
        w = fn(rr, t, idx, mask, kind)
        (w * gw).sum().backward()
        return w.detach(), rr.grad, b.grad

    w1, gr1, gb1 = grads(GateWeights.apply)
    w2, gr2, gb2 = grads(reference)
    torch.testing.assert_close(w1, w2, rtol=0, atol=0)
    assert (w1[~mask] == 0).all() and (gr1[0, 3] == 0)
    torch.testing.assert_close(gr1, gr2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gb1, gb2, rtol=1e-12, atol=1e-12)
    assert gr1.abs().sum() > 0 and gb1.abs().sum() > 0


def test_route_keeps_less_for_the_backward():
    """The graph of a training route keeps the logits (shared with the marginals), int32 indices and
    the mask: under 2 MiB at T = 4096, N = 64, k = 8 (softmax + top-k keeps 1.25 MiB)."""
    import probmoe

    r = torch.randn(4096, 64, requires_grad=True)
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = probmoe.route(r, k=8, training=True, generator=torch.Generator().manual_seed(0))
    assert sum(seen.values()) / 2**20 < 2.0, seen
    out.weights.sum().backward()
    assert r.grad.abs().sum() > 0
