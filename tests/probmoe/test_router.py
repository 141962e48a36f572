"""ProbMoERouter: HF router shape, precision, reproducibility, no_grad / inference_mode / checkpoint."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import probmoe


def make(**kw):
    torch.manual_seed(0)
    if "kmin" not in kw and "kmax" not in kw:
        kw.setdefault("k", 2)
    return probmoe.ProbMoERouter(16, 8, **kw)


def test_forward_matches_hf_topk_router_in_eval():
    router = make(k=2).eval()
    h = torch.randn(3, 5, 16)
    logits, weights, indices = router(h)
    assert logits.shape == (15, 8) and weights.shape == (15, 2) and indices.shape == (15, 2)
    ref_logits = F.linear(h.reshape(-1, 16), router.weight)
    vals, idx = torch.topk(torch.softmax(ref_logits, dim=-1, dtype=torch.float), 2)
    assert torch.equal(logits, ref_logits) and torch.equal(indices, idx) and torch.equal(weights, vals)
    assert router.last_routing.indices is indices


def test_training_draws_and_dynamic_k():
    router = make(kmin=1, kmax=4)
    _, weights, indices = router(torch.randn(200, 16))
    routing = router.last_routing
    assert weights.shape == (200, 4) and ((routing.counts >= 1) & (routing.counts <= 4)).all()
    assert (weights[~routing.mask] == 0).all()


def test_half_precision_routes_in_float32():
    router = make(k=2)
    h = torch.randn(40, 16)
    for dtype in (torch.bfloat16, torch.float16):
        r = make(k=2).to(dtype).eval()
        logits, weights, indices = r(h.to(dtype))
        assert logits.dtype == dtype and weights.dtype == torch.float32
        vals, idx = torch.topk(torch.softmax(logits.float(), -1), 2)
        assert torch.equal(indices, idx) and torch.equal(weights, vals)
    assert router.weight.dtype == torch.float32


def test_seeded_generator_is_reproducible():
    h = torch.randn(100, 16)
    a = make(generator=torch.Generator().manual_seed(1))(h)[2]
    b = make(generator=torch.Generator().manual_seed(1))(h)[2]
    c = make(generator=torch.Generator().manual_seed(2))(h)[2]
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("train", [True, False])
def test_no_grad_and_inference_mode(ctx, train):
    router = make(kmin=1, kmax=3).train(train)
    with ctx():
        logits, weights, indices = router(torch.randn(10, 16))
    assert weights.shape == (10, 3) and not weights.requires_grad


def toy_moe(router, experts, h):
    """A tiny MoE layer: sum over slots of weight * (h @ expert matrix)."""
    _, w, idx = router(h)
    out = torch.einsum("td,tkde->tke", h, experts[idx])  # [T, kmax, D]
    return (w.unsqueeze(-1) * out).sum(1)


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("seeded", [True, False])
def test_checkpoint_recomputes_the_same_draw(use_reentrant, seeded):
    experts = torch.randn(8, 16, 16)
    h = torch.randn(64, 16)
    grads = []
    for ckpt in (False, True):
        router = make(kmin=1, kmax=3, generator=torch.Generator().manual_seed(3) if seeded else None)
        x = h.clone().requires_grad_()
        torch.manual_seed(11)
        if ckpt:
            y = checkpoint(toy_moe, router, experts, x, use_reentrant=use_reentrant)
        else:
            y = toy_moe(router, experts, x)
        y.square().sum().backward()
        grads.append((x.grad, router.weight.grad))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_with_interleaved_forwards(use_reentrant):
    """Other train-mode forwards between a checkpointed forward and its backward (a second
    checkpointed forward backwarded later, or a no-grad forward) do not change what it replays."""
    experts = torch.randn(8, 16, 16)
    h1, h2 = torch.randn(64, 16), torch.randn(64, 16)

    def grads(ckpt, between):
        router = make(kmin=1, kmax=3, generator=torch.Generator().manual_seed(3))
        x1, x2 = h1.clone().requires_grad_(), h2.clone().requires_grad_()
        run = (
            (lambda x: checkpoint(toy_moe, router, experts, x, use_reentrant=use_reentrant))
            if ckpt
            else (lambda x: toy_moe(router, experts, x))
        )
        torch.manual_seed(11)
        y1 = run(x1).square().sum()
        if between == "forward":
            y2 = run(x2).square().sum()
            y1.backward()
            y2.backward()
        else:
            with torch.no_grad():
                router(h2)
            y1.backward()
        return x1.grad, router.weight.grad

    for between in ("forward", "no_grad"):
        torch.testing.assert_close(grads(False, between), grads(True, between), atol=1e-6, rtol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="k must be in"):
        probmoe.ProbMoERouter(16, 8, k=9)
    with pytest.raises(ValueError, match="method must be"):
        probmoe.ProbMoERouter(16, 8, k=2, method="greedy")
    with pytest.raises(ValueError, match=r"hidden_states must have shape \[\.\.\., 16\]"):
        make()(torch.randn(4, 15))
    with pytest.raises(ValueError, match=r"hidden_states must have shape \[\.\.\., 16\], got \[\]"):
        make()(torch.tensor(1.0))
    for h in (torch.ones(4, 16, dtype=torch.long), torch.ones(4, 16, dtype=torch.int32)):
        with pytest.raises(ValueError, match="hidden_states must be a tensor of dtype float16, bfloat16, float32"):
            make().eval()(h)
    with pytest.raises(ValueError, match=r"hidden_size must be in \[1, 2147483648\], got 0$"):
        probmoe.ProbMoERouter(0, 8, k=2)
    with pytest.raises(ValueError, match="backend must be one of"):
        probmoe.ProbMoERouter(16, 8, k=2, backend="magic")
    with pytest.raises(ValueError, match="grad must be one of"):
        probmoe.ProbMoERouter(16, 8, k=2, grad="straight")
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        probmoe.ProbMoERouter(16, 8, k=2, generator=3)
