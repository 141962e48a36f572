"""Training features: gradient checkpointing (same subsets on recomputation), bf16, router statistics."""

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

import probmoe
import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.testing import tiny_model


def batch(seed=0):
    return torch.randint(3, 256, (2, 12), generator=torch.Generator().manual_seed(seed))


def grads_of(family, method, checkpointing, own_generator, **kwargs):
    torch.manual_seed(123)
    gen = torch.Generator().manual_seed(7) if own_generator else None
    model = pt.patch_model(tiny_model(family), method, generator=gen, **kwargs).train()
    if checkpointing is not None:
        model.activation_checkpointing_enable({"use_reentrant": checkpointing})
    x = batch()
    out = model(x, labels=x)
    out.loss.backward()
    stats = [s["indices"] for s in pt.router_stats(model)]
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, stats


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("own_generator", [True, False])
@pytest.mark.parametrize(
    "family,method", [("olmoe", "probmoe"), ("mixtral", "probmoe-dynamic"), ("qwen2_moe", "sample-dense-ste")]
)
def test_gradient_checkpointing_draws_the_same_subsets(family, method, reentrant, own_generator):
    loss, grads, idx = grads_of(family, method, None, own_generator)
    loss_ckpt, grads_ckpt, idx_ckpt = grads_of(family, method, reentrant, own_generator)
    assert torch.equal(loss, loss_ckpt)
    assert all(torch.equal(a, b) for a, b in zip(idx, idx_ckpt))  # the recomputation's routing: the same subsets
    routers = [n for n in grads if n.endswith("mlp.gate.weight")]
    assert len(routers) == 2 and all(grads_ckpt[n].abs().sum() > 0 for n in routers)
    assert set(grads) == set(grads_ckpt)
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_aux_loss_under_non_reentrant_checkpointing():
    # (reentrant checkpointing runs the forward without grad, so transformers' captured router
    # logits, and every aux loss built from them, stock or ours, carry no gradient there)
    plain = grads_with_aux(None)
    ckpt = grads_with_aux(False)
    torch.testing.assert_close(ckpt, plain, atol=1e-6, rtol=1e-5)


def grads_with_aux(checkpointing):
    torch.manual_seed(0)
    model = pt.patch_model(tiny_model("qwen3_moe"), "probmoe", aux_loss=1.0, z_loss=0.1).train()
    if checkpointing is not None:
        model.activation_checkpointing_enable({"use_reentrant": checkpointing})
    x = batch()
    out = model(x, output_router_logits=True)
    (out.aux_loss + 0.1 * model.probmoe_last_z_loss).backward()
    return torch.cat([b.gate.weight.grad.flatten() for b in model.probmoe_family.blocks(model)])


@pytest.mark.parametrize("family", ["olmoe", "mixtral"])
@pytest.mark.parametrize("method", ["probmoe", "probmoe-dynamic", "densemixer"])
def test_bf16_autocast_on_cpu(family, method):
    model = pt.patch_model(tiny_model(family), method, generator=torch.Generator().manual_seed(0)).train()
    x = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, labels=x, output_router_logits=True)
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(b.gate.weight.grad.abs().sum() > 0 for b in model.probmoe_family.blocks(model))


@pytest.mark.parametrize("family", pt.SUPPORTED)
def test_bf16_model_eval_equals_stock(family):
    stock = tiny_model(family).to(torch.bfloat16).eval()
    model = pt.patch_model(tiny_model(family).to(torch.bfloat16), "probmoe").eval()
    x = batch(1)
    with torch.no_grad():
        assert torch.equal(model(x).logits, stock(x).logits)


def test_router_stats_after_a_step():
    model = pt.patch_model(
        tiny_model("qwen3_moe"), "probmoe-dynamic", kmin=1, kmax=3, generator=torch.Generator().manual_seed(0)
    ).train()
    stats = pt.router_stats(model)
    assert [s["layer"] for s in stats] == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert all(s["routing"] is None and s["expert_counts"] is None for s in stats)  # before any forward
    x = batch()
    model(x, labels=x).loss.backward()
    for s in pt.router_stats(model):
        routing = s["routing"]
        assert isinstance(routing, probmoe.Routing)
        assert routing.config.kmin == 1 and routing.config.kmax == 3
        assert s["indices"].shape == (x.numel(), 3) and s["mask"].shape == (x.numel(), 3)
        assert torch.equal(s["experts_per_token"], routing.counts)
        assert int(s["expert_counts"].sum()) == int(routing.counts.sum())
        assert torch.equal(s["selected"], routing.selected())
        assert s["expert_counts"].shape == (8,)
    stock = pt.patch_model(tiny_model("olmoe"), "conventional")
    stock(x)
    s = pt.router_stats(stock)[0]
    assert s["routing"] is None and s["indices"].shape == (x.numel(), 2)
    assert int(s["expert_counts"].sum()) == 2 * x.numel()
