"""DenseMixer ("densemixer") against a plain per-expert reference written here.

The reference follows DenseMixer's own formulation: every expert runs on every token; the forward
value is the sparse top-k mixture; the router gets the dense gradient Σ_e ∂L/∂y · out_e · ∂w_e;
the experts (and the hidden states through them) get gradients only from the tokens routed to
them (a gradient hook masks the rest). With renormalisation, DenseMixer's "partscale_fix_expert"
weights π·(1 − mask)/stopgrad(norm) + π·mask/norm.
"""

import types

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", minversion="5.0")

import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.testing import tiny_model


def reference_block(block, hidden_states, *, k, normalize):
    """DenseMixer for one MoE block, expert by expert: [B, S, D] -> [B, S, D]."""
    b, s, d = hidden_states.shape
    h = hidden_states.reshape(-1, d)  # [T, D]
    experts = block.experts
    n = experts.gate_up_proj.shape[0]
    logits = F.linear(h, block.gate.weight)  # [T, N]
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top_w, selected = torch.topk(probs, k, dim=-1)  # [T, k]
    if normalize:
        norm = top_w.sum(dim=-1, keepdim=True)
        top_w = top_w / norm
        mask = F.one_hot(selected, n).sum(dim=1).to(probs.dtype)  # [T, N]
        probs = probs * (1 - mask) / norm.detach() + probs * mask / norm
    dense = torch.zeros_like(h)
    sparse = torch.zeros_like(h)
    for e in range(n):
        gate, up = F.linear(h, experts.gate_up_proj[e]).chunk(2, dim=-1)
        out = F.linear(experts.act_fn(gate) * up, experts.down_proj[e])  # [T, D], every token
        routed = (selected == e).any(dim=1).to(out.dtype).unsqueeze(-1)  # [T, 1]
        out.register_hook(lambda grad, routed=routed: grad * routed)
        dense = dense + out * probs[:, e : e + 1]
        token, slot = torch.where(selected == e)
        sparse = sparse.index_add(0, token, out[token] * top_w[token, slot].unsqueeze(-1))
    y = sparse.detach() + (dense - dense.detach())
    if hasattr(block, "shared_expert"):  # Qwen2-MoE
        y = y + torch.sigmoid(block.shared_expert_gate(h)) * block.shared_expert(h)
    return y.reshape(b, s, d)


CASES = [
    ("olmoe", {}),
    ("olmoe", dict(norm_topk_prob=True)),
    ("qwen2_moe", {}),
    ("qwen3_moe", {}),
    ("qwen3_moe", dict(norm_topk_prob=True)),
    ("mixtral", {}),
]


@pytest.mark.parametrize("family,overrides", CASES)
def test_densemixer_equals_per_expert_reference(family, overrides):
    model = pt.patch_model(tiny_model(family, **overrides), "densemixer").train()
    ref = tiny_model(family, **overrides).train()
    family_ = model.probmoe_family
    for block in family_.blocks(ref):
        normalize = family_.normalize(ref.config)
        block.forward = types.MethodType(
            lambda self, x, normalize=normalize: reference_block(
                self, x, k=ref.config.num_experts_per_tok, normalize=normalize
            ),
            block,
        )
    x = torch.randint(3, 256, (3, 10), generator=torch.Generator().manual_seed(0))
    out, want = model(x, labels=x), ref(x, labels=x)
    torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=0)
    out.loss.backward()
    want.loss.backward()
    grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        q = grads[name]
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)
    router = [b.gate.weight.grad for b in family_.blocks(model)]
    assert all(g.abs().sum() > 0 for g in router)


@pytest.mark.parametrize("family", pt.SUPPORTED)
def test_densemixer_is_dense_in_training_and_sparse_at_eval(family):
    model = pt.patch_model(tiny_model(family), "densemixer")
    seen = []
    for block in model.probmoe_family.blocks(model):
        block.experts.register_forward_pre_hook(lambda mod, args: seen.append(tuple(args[1].shape)))
    x = torch.randint(3, 256, (2, 6))
    model.train()(x)
    assert seen == [(12, 8), (12, 8)]  # all N experts per token
    seen.clear()
    stock = tiny_model(family).eval()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x).logits, stock(x).logits, atol=1e-6, rtol=0)
    assert seen == [(12, 2), (12, 2)]  # top-k only
