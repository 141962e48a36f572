"""DeepSeek-V3 in the transformers integration: stock, every ProbMoE method and "probmoe-grouped" (exactly
k experts from at most topk_group of n_group groups, the model's own limit).

Tiny random model (testing.py): 3 layers (the first dense), 8 routed experts in 4 groups of 2,
topk_group 2, top-3, 1 shared expert, routed_scaling_factor 2.5, norm_topk_prob.
"""

import itertools
import json

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

from training_steps import train_steps

import circuits
import probmoe
import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.testing import tiny_model

EXACT_K = ("conventional", "frozen", "densemixer", "probmoe", "sample-dense-ste", "topk-marginal", "probmoe-grouped")


def batch(seed=0, shape=(4, 16)):
    return torch.randint(3, 256, shape, generator=torch.Generator().manual_seed(seed))


def gates(model):
    return [b.mlp.gate for b in model.model.layers if hasattr(b.mlp, "gate")]


def allowed_subsets(n=8, k=3, group=2, max_groups=2) -> torch.Tensor:
    """Every subset of k experts from at most max_groups groups: [M, n] float."""
    rows = [
        z
        for z in itertools.product((0.0, 1.0), repeat=n)
        if sum(z) == k and sum(any(z[g * group : (g + 1) * group]) for g in range(n // group)) <= max_groups
    ]
    return torch.tensor(rows)


def test_families_and_methods():
    assert pt.GROUPED_FAMILIES == ("deepseek_v3",) and pt.ALL_FAMILIES == pt.SUPPORTED + ("deepseek_v3",)
    assert pt.GROUPED_METHODS == ("probmoe-grouped",) and pt.ALL_METHODS == pt.METHODS + ("probmoe-grouped",)
    model = pt.patch_model(tiny_model("deepseek_v3"), "probmoe-grouped")
    routing = model.probmoe_plan.routing
    assert routing.constraint == circuits.GroupLimited(8, 3, 4, 2) and routing.scores == "sigmoid"
    assert routing.normalize and model.probmoe_plan.scale == 2.5 and routing.kmax == 3
    assert len(gates(model)) == 2  # the dense first layer has no router


@pytest.mark.parametrize("method", [m for m in pt.ALL_METHODS if m not in ("sparsemixer", "remoe")])
def test_training_reduces_loss_and_reaches_routers(method):
    model = pt.patch_model(tiny_model("deepseek_v3"), method, generator=torch.Generator().manual_seed(1))
    losses, before, after = train_steps(model, gates(model), batch(), method == "frozen")
    assert losses[-1] < losses[0] - 0.2, losses
    assert all(torch.equal(a, b) for a, b in zip(before, after)) == (method == "frozen")
    if method == "probmoe-grouped":  # every drawn subset keeps to the group limit
        for s in pt.router_stats(model):
            groups_used = s["selected"].view(-1, 4, 2).any(-1).sum(-1)
            assert bool((groups_used <= 2).all()) and bool((s["experts_per_token"] == 3).all())
    if method == "probmoe-dynamic":
        assert all(
            ((s["experts_per_token"] >= 1) & (s["experts_per_token"] <= 3)).all() for s in pt.router_stats(model)
        )


@pytest.mark.parametrize("method", EXACT_K)
def test_eval_equals_stock_where_the_map_is_stock_routing(method):
    """With topk_group = n_group (no group limit) and a zero bias, stock routing is top-k of
    sigmoid(r), which is the MAP of every exactly-k method: the outputs equal the stock model's."""
    stock = tiny_model("deepseek_v3", topk_group=4).eval()
    model = pt.patch_model(tiny_model("deepseek_v3", topk_group=4), method).eval()
    x = batch(1)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, stock(x).logits, atol=1e-5, rtol=0)
    kw = dict(max_new_tokens=5, do_sample=False, use_cache=True, pad_token_id=0)
    if method == "probmoe-grouped":
        assert torch.equal(model.generate(batch(2, (2, 4)), **kw), stock.generate(batch(2, (2, 4)), **kw))


def test_grouped_eval_is_the_exact_map_and_differs_from_stock_grouping():
    """With the limit binding (top-3 from 2 of 4 groups), "probmoe-grouped" takes the allowed subset
    with the largest sum of logits (brute force); the stock router ranks groups by their top-2
    sigmoid scores and takes the top-3 there: allowed too, never better, and sometimes worse."""
    model = pt.patch_model(tiny_model("deepseek_v3"), "probmoe-grouped").eval()
    stock = tiny_model("deepseek_v3").eval()
    x = batch(3, (8, 16))
    seen = []
    gates(stock)[0].register_forward_hook(lambda module, args, out: seen.append(out[2]))
    with torch.no_grad():
        model(x)
        stock_out = stock(x, output_router_logits=True)
    allowed = allowed_subsets()
    # the selection below reproduces the stock router's own choice
    assert torch.equal(_stock_choice(stock, 0, stock_out.router_logits[0]).sort(-1).values, seen[0].sort(-1).values)
    worse = 0
    for layer, gate in enumerate(gates(model)):
        rec = gate.probmoe_last
        logits = rec.routing.distribution.logits
        if layer == 0:  # the same float32 logits as stock (later layers see differently routed inputs)
            torch.testing.assert_close(logits, stock_out.router_logits[0], atol=1e-6, rtol=0)
        got = rec.selected.float()
        assert torch.equal(got, allowed[(logits @ allowed.T).argmax(-1)])  # the brute-force MAP
        stock_sel = torch.zeros_like(got).scatter_(-1, _stock_choice(stock, layer, logits), 1.0)
        assert bool(((stock_sel @ allowed.T) == 3).any(-1).all())  # the stock choice is allowed
        gap = (got * logits).sum(-1) - (stock_sel * logits).sum(-1)
        assert bool((gap >= -1e-6).all())
        worse += int((gap > 1e-6).sum())
    assert worse > 0


def _stock_choice(stock, layer, logits):
    """The stock DeepSeek-V3 router's experts [T, 3] at the given logits [T, 8] (its selection, step by step)."""
    gate = gates(stock)[layer]
    scores = logits.sigmoid() + gate.e_score_correction_bias
    group_scores = scores.view(-1, 4, 2).topk(2, dim=-1)[0].sum(-1)
    group_idx = group_scores.topk(2, dim=-1)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1).repeat_interleave(2, dim=-1)
    return scores.masked_fill(mask == 0, -torch.inf).topk(3, dim=-1)[1]


def test_selection_bias_moves_stock_routing_not_probmoe():
    """e_score_correction_bias shifts the stock selection only; the ProbMoE methods route by the
    logits alone (docs/constraints.md), so a bias changes stock outputs and leaves ours."""
    x = batch(4)
    outs = {}
    for bias in (False, True):
        stock = tiny_model("deepseek_v3", topk_group=4).eval()
        model = pt.patch_model(tiny_model("deepseek_v3", topk_group=4), "probmoe-grouped").eval()
        if bias:
            for g in gates(stock) + gates(model):
                g.e_score_correction_bias.copy_(torch.linspace(-0.3, 0.3, 8))
        with torch.no_grad():
            outs[bias] = (stock(x).logits, model(x).logits)
    assert not torch.allclose(outs[True][0], outs[False][0])
    assert torch.equal(outs[True][1], outs[False][1])


def test_checkpoint_keeps_stock_keys_and_the_constraint(tmp_path):
    from transformers import AutoModelForCausalLM

    model = pt.patch_model(tiny_model("deepseek_v3"), "probmoe-grouped", grad="paper")
    assert list(model.state_dict()) == list(tiny_model("deepseek_v3").state_dict())
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / pt.SETTINGS_FILENAME).read_text())
    assert data["method"] == "probmoe-grouped" and data["routing"]["constraint"] == {
        "type": "GroupLimited",
        "n": 8,
        "kmin": 3,
        "kmax": 3,
        "groups": [2, 2, 2, 2],
        "max_groups": 2,
        "capacity": 2,
    }
    stock, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    reloaded = pt.from_pretrained(tmp_path)
    assert reloaded.probmoe_plan == model.probmoe_plan
    x = batch(5)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(x).logits, model.eval()(x).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", ["probmoe-grouped", "densemixer", "probmoe-dynamic", "frozen"])
def test_unpatch_restores_stock_bit_for_bit(method):
    stock, model = tiny_model("deepseek_v3"), tiny_model("deepseek_v3")
    classes = {n: type(m) for n, m in model.named_modules()}
    pt.patch_model(model, method)
    x = batch(6)
    model.train()
    model(x, labels=x, output_router_logits=True).loss.backward()
    model.zero_grad(set_to_none=True)
    pt.unpatch_model(model)
    assert {n: type(m) for n, m in model.named_modules()} == classes
    assert not any(name.startswith("probmoe_") for m in model.modules() for name in vars(m))
    assert all(p.requires_grad for p in model.parameters())
    for mode in (True, False):
        stock.train(mode), model.train(mode)
        assert torch.equal(stock(x, labels=x).loss, model(x, labels=x).loss)


def test_densemixer_forward_is_stock_and_its_router_gradient_dense():
    x = batch(7)
    stock = tiny_model("deepseek_v3").train()
    model = pt.patch_model(tiny_model("deepseek_v3"), "densemixer").train()
    a, b = stock(x, labels=x), model(x, labels=x)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
    a.loss.backward(), b.loss.backward()
    for g_stock, g_dense in zip(gates(stock), gates(model)):
        assert not torch.allclose(g_stock.weight.grad, g_dense.weight.grad)
        assert bool((g_dense.weight.grad.abs().sum(-1) > 0).all())  # every expert's row gets a gradient


def test_load_balancing_loss_uses_normalised_sigmoid_scores():
    model = pt.patch_model(tiny_model("deepseek_v3"), "probmoe-grouped", aux_loss=0.5).eval()  # MAP: deterministic
    x = batch(8)
    out = model(x, labels=x, output_router_logits=True)
    stats = pt.router_stats(model)
    frac = sum(s["selected"].float().mean(0) for s in stats) / len(stats)
    scores = [torch.sigmoid(r.float()) for r in out.router_logits]
    probs = sum((p / p.sum(-1, keepdim=True)).mean(0) for p in scores) / len(scores)
    torch.testing.assert_close(out.aux_loss, 8 * (frac * probs).sum())
    plain = model(x, labels=x)  # no router logits asked: no aux loss
    torch.testing.assert_close(out.loss, plain.loss + 0.5 * out.aux_loss)


BAD = [
    (dict(method="probmoe-grouped", k=5), r"k must be in \[0, 4\], got 5: groups 4x2 with max_groups = 2"),
    (dict(method="probmoe-grouped", kmin=1, kmax=2), "kmin/kmax: method 'probmoe-grouped' routes exactly k"),
    (dict(method="grouped"), "method must be one of .*'probmoe-grouped'"),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_bad_arguments(kwargs, message):
    model = tiny_model("deepseek_v3")
    with pytest.raises(ValueError, match=message):
        pt.patch_model(model, **kwargs)
    assert not pt.is_patched(model)


def test_grouped_method_needs_groups():
    with pytest.raises(ValueError, match="model type 'olmoe' has none .*deepseek_v3"):
        pt.patch_model(tiny_model("olmoe"), "probmoe-grouped")


def test_probmoe_router_routes_like_the_grouped_method():
    """probmoe.route with the same constraint reproduces the patched gate's eval routing."""
    model = pt.patch_model(tiny_model("deepseek_v3"), "probmoe-grouped").eval()
    with torch.no_grad():
        model(batch(9))
    rec = gates(model)[0].probmoe_last
    logits = rec.routing.distribution.logits
    out = probmoe.route(
        logits, constraint=circuits.GroupLimited(8, 3, 4, 2), scores="sigmoid", normalize=True, training=False
    )
    assert torch.equal(out.indices, rec.indices)


def test_grouped_method_on_the_group_dp():
    """algorithm="dp" routes "probmoe-grouped" by the group DP (nothing compiled): the same eval
    routing as the compiled circuit, and a training step whose draws are all allowed."""
    x = batch(9)
    routed = {}
    for algorithm in ("circuit", "dp"):
        model = pt.patch_model(tiny_model("deepseek_v3"), "probmoe-grouped", algorithm=algorithm).eval()
        with torch.no_grad():
            model(x)
        routed[algorithm] = gates(model)[0].probmoe_last.indices
    assert torch.equal(routed["dp"], routed["circuit"])
    model = pt.patch_model(tiny_model("deepseek_v3"), "probmoe-grouped", algorithm="dp").train()
    model(x, labels=x).loss.backward()
    allowed = allowed_subsets()
    for gate in gates(model):
        got = gate.probmoe_last.selected.float()
        assert bool(((got @ allowed.T) == 3).any(-1).all())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
