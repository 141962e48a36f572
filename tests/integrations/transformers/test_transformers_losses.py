"""Auxiliary losses from what was actually routed: load balancing and router z-loss."""

import math

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func

import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.testing import tiny_model


def selected_of(pairs, n):
    """[[experts of token 0], ...] -> [T, N] bool."""
    out = torch.zeros(len(pairs), n, dtype=torch.bool)
    for t, experts in enumerate(pairs):
        out[t, experts] = True
    return out


def test_balanced_routing():
    # 8 tokens, 4 experts, 2 each, every expert used by 4 tokens, uniform probabilities:
    # N * sum_i f_i P_i = 4 * 4 * (0.5 * 0.25) = 2 (= k, the minimum)
    logits = torch.zeros(8, 4)
    sel = selected_of([[0, 1], [2, 3]] * 4, 4)
    assert pt.load_balancing_loss((logits,), (sel,)).item() == pytest.approx(2.0, abs=1e-6)


def test_collapsed_routing():
    # every token to experts 0 and 1 with probability 1/2 each: 4 * (1 * 0.5 + 1 * 0.5) = 4
    logits = torch.tensor([[50.0, 50.0, 0.0, 0.0]]).repeat(8, 1)
    sel = selected_of([[0, 1]] * 8, 4)
    assert pt.load_balancing_loss((logits,), (sel,)).item() == pytest.approx(4.0, abs=1e-6)


def test_sampled_routing_counts_the_experts_that_ran():
    # the logits favour experts 0, 1, but the routing (sampled) used 2, 3: HF's loss recomputes
    # top-k and sees a collapse (4), the experts that actually ran carry ~0 probability
    logits = torch.tensor([[50.0, 50.0, 0.0, 0.0]]).repeat(8, 1)
    sel = selected_of([[2, 3]] * 8, 4)
    ours = pt.load_balancing_loss((logits,), (sel,)).item()
    hf = load_balancing_loss_func((logits,), 4, 2).item()
    assert hf == pytest.approx(4.0, abs=1e-6)
    assert ours == pytest.approx(4 * 2 * math.exp(-50) / (2 + 2 * math.exp(-50)), abs=1e-12)


def test_dynamic_routing_fractions():
    # two layers; tokens use 1 or 3 experts; uniform probabilities: N * sum_i f_i / N = mean experts per token
    logits = torch.zeros(4, 4)
    a = selected_of([[0], [1, 2, 3], [2], [0, 1, 3]], 4)  # 8 slots over 4 tokens
    b = selected_of([[0], [1], [2], [3]], 4)  # 4 slots
    assert pt.load_balancing_loss((logits, logits), (a, b)).item() == pytest.approx(1.5, abs=1e-6)


def test_attention_mask_excludes_padding():
    logits = torch.zeros(4, 4)
    sel = selected_of([[0, 1], [0, 1], [2, 3], [2, 3]], 4)
    mask = torch.tensor([[1, 1, 0, 0]])  # tokens 2, 3 are padding: only experts 0, 1 count
    # f = [1, 1, 0, 0], P = 1/4 each -> 4 * (0.25 + 0.25) = 2
    assert pt.load_balancing_loss((logits,), (sel,), mask).item() == pytest.approx(2.0, abs=1e-6)
    collapsed = torch.tensor([[9.0, 0.0, 0.0, 0.0]]).repeat(4, 1)
    sel = selected_of([[0, 1]] * 4, 4)
    g = torch.Generator().manual_seed(0)
    pad = torch.randint(0, 2, (2, 2), generator=g)
    pad[0, 0] = 1
    torch.testing.assert_close(
        pt.load_balancing_loss((collapsed,), (sel,), pad), load_balancing_loss_func((collapsed,), 4, 2, pad)
    )


def test_equals_hf_for_top_k():
    g = torch.Generator().manual_seed(0)
    logits = tuple(torch.randn(12, 8, generator=g) for _ in range(3))
    sel = tuple(selected_of(r.topk(2).indices.tolist(), 8) for r in logits)
    mask = (torch.rand(3, 4, generator=g) > 0.3).long()
    torch.testing.assert_close(pt.load_balancing_loss(logits, sel), load_balancing_loss_func(logits, 8, 2))
    torch.testing.assert_close(pt.load_balancing_loss(logits, sel, mask), load_balancing_loss_func(logits, 8, 2, mask))


def test_load_balancing_needs_one_selection_per_layer():
    with pytest.raises(ValueError, match="one selection per layer"):
        pt.load_balancing_loss((torch.zeros(2, 4),), ())


def test_z_loss():
    logits = torch.zeros(6, 4)  # logsumexp = log 4
    assert pt.router_z_loss((logits,)).item() == pytest.approx(math.log(4) ** 2, rel=1e-6)
    big = torch.full((2, 4), 10.0)
    mask = torch.tensor([[1, 1, 0, 0]])  # rows 2, 3 (the large logits) are padding
    both = (torch.cat([logits[:2], big]),)  # [4, 4]
    assert pt.router_z_loss(both, mask).item() == pytest.approx(math.log(4) ** 2, rel=1e-6)
    assert pt.router_z_loss((logits, big)).item() == pytest.approx(
        (6 * math.log(4) ** 2 + 2 * (10 + math.log(4)) ** 2) / 8, rel=1e-6
    )


@pytest.mark.parametrize("family", pt.SUPPORTED)
def test_conventional_keeps_hf_loss(family):
    stock, model = tiny_model(family).train(), pt.patch_model(tiny_model(family), "conventional").train()
    x = torch.randint(3, 256, (2, 8))
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    a = stock(x, attention_mask=mask, labels=x, output_router_logits=True)
    b = model(x, attention_mask=mask, labels=x, output_router_logits=True)
    torch.testing.assert_close(b.aux_loss, a.aux_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_losses_added_to_the_model_loss(family):
    model = pt.patch_model(
        tiny_model(family), "probmoe-dynamic", z_loss=0.01, generator=torch.Generator().manual_seed(0)
    ).train()
    x = torch.randint(3, 256, (2, 8))
    out = model(x, labels=x, output_router_logits=True)
    selected = [s["selected"] for s in pt.router_stats(model)]
    balance = pt.load_balancing_loss(out.router_logits, selected)
    z = pt.router_z_loss(out.router_logits)
    torch.testing.assert_close(out.aux_loss, balance)
    torch.testing.assert_close(model.probmoe_last_z_loss, z)
    plain = model(x, labels=x, output_router_logits=False)  # no router logits: no aux terms, as in transformers
    assert plain.aux_loss is None
    coef = model.config.router_aux_loss_coef
    lm = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 256), x[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, lm + coef * balance + 0.01 * z, atol=1e-5, rtol=0)
    # the aux terms reach the routers
    model.zero_grad()
    (coef * out.aux_loss + 0.01 * model.probmoe_last_z_loss).backward()
    assert all(b.gate.weight.grad.abs().sum() > 0 for b in model.probmoe_family.blocks(model))
    # and can be switched off
    off = pt.patch_model(tiny_model(family), "probmoe", aux_loss=0, z_loss=0).train()
    out = off(x, labels=x, output_router_logits=True)
    lm = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 256), x[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, lm, atol=1e-5, rtol=0)
    assert out.aux_loss is not None and off.probmoe_last_z_loss is None


def test_return_dict_false():
    model = pt.patch_model(tiny_model("olmoe"), "probmoe").train()
    x = torch.randint(3, 256, (2, 8))
    out = model(x, labels=x, output_router_logits=True, return_dict=False)
    assert isinstance(out, tuple) and out[0].dim() == 0
