"""Dynamic-k: the slots a token does not use are never computed, under every experts implementation."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("transformers", minversion="5.0")

import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers import experts as skipping
from probmoe.integrations.transformers.experts import active_slots
from probmoe.integrations.transformers.testing import tiny_model

IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")
UP = 2 * 128  # the fused gate_up projection's width in the tiny models (2 x intermediate 128)


def batch(seed=0):
    return torch.randint(3, 256, (4, 16), generator=torch.Generator().manual_seed(seed))


def dynamic(family, impl, seed=0):
    model = tiny_model(family)
    model.set_experts_implementation(impl)
    return pt.patch_model(model, "probmoe-dynamic", kmin=1, kmax=3, generator=torch.Generator().manual_seed(seed))


def test_active_slots_reads_the_routing_contract():
    w = torch.tensor([[0.5, 0.0, 0.0], [0.25, 0.125, 0.0], [0.5, 0.25, 0.125]])  # unused slots: weight 0
    want = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
    assert torch.equal(active_slots(w), want)


class RowCounter(TorchDispatchMode):
    """Rows fed to the experts' up projection (matmuls whose output is UP wide)."""

    def __init__(self):
        super().__init__()
        self.rows = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if (
            "mm" in name
            and isinstance(out, torch.Tensor)
            and ((name == "bmm" and out.dim() == 3 and out.shape[1] == UP) or (out.dim() == 2 and out.shape[-1] == UP))
        ):
            self.rows += out.shape[0]
        return out


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("family", pt.SUPPORTED)
@pytest.mark.parametrize("training", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_experts_see_only_active_rows_and_match_the_zero_weight_reference(family, impl, training):
    model = dynamic(family, impl).train(training)
    reference = dynamic(family, impl).train(training)  # same weights, same draws ...
    for block in reference.probmoe_family.blocks(reference):  # ... but all kmax slots computed, unused at weight 0
        skipping.uninstall(block.experts)
    seen, inputs = [], []
    for block in model.probmoe_family.blocks(model):
        experts = block.experts
        original = experts.probmoe_dispatch

        def observe(h, token, expert, weight, original=original):
            seen.append(torch.stack([token, expert], dim=-1))
            return original(h, token, expert, weight)

        experts.probmoe_dispatch = observe
        experts.register_forward_pre_hook(lambda mod, args: inputs.append(tuple(a.detach() for a in args)))
    x = batch()
    out, want = model(x, labels=x), reference(x, labels=x)

    stats = pt.router_stats(model)
    total = 0
    for rows, s in zip(seen, stats):
        token, slot = s["mask"].nonzero(as_tuple=True)
        active = torch.stack([token, s["indices"][token, slot]], dim=-1)  # the (token, expert) pairs routed
        assert torch.equal(rows, active)
        total += rows.shape[0]
    kmax_rows = 2 * x.numel() * 3
    assert total < kmax_rows  # some tokens use fewer than kmax experts ...
    assert total >= 2 * x.numel()  # ... and every token at least one
    torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=0)
    if training:
        out.loss.backward()
        want.loss.backward()
        ref = dict(reference.named_parameters())
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, ref[name].grad, atol=1e-5, rtol=1e-4, msg=name)

    # what the experts compute: rows of the up projection, skipping against all kmax slots
    experts = model.probmoe_family.blocks(model)[0].experts
    h, idx, w = inputs[0]
    with torch.no_grad():
        with RowCounter() as skip:
            experts(h, idx, w)
        skipping.uninstall(experts)
        with RowCounter() as full:
            experts(h, idx, w)
    assert skip.rows == int(active_slots(w).sum()) < full.rows == idx.numel()
