"""A routing method defined and registered in this file alone trains, saves, reloads, serves (the
vLLM plugin's rule, without vLLM) and evaluates: nothing outside the method's module (here, this
file) names it (issue 47: a new baseline is one module plus its tests).

The method, "relu-topk": the top-k experts of r, weighted by ReLU(r) (not renormalised). Training
adds Gaussian noise of scale ``jitter`` to the logits the experts are chosen by (drawn from the
router's generator); inference takes the top-k of r itself.
"""

import pytest
import torch

from probmoe.methods import Gate, Method, Routed, Serving, get_method, register_method, unregister_method

pt = pytest.importorskip("probmoe.integrations.transformers")
from probmoe.experiments.checkpoints import describe  # noqa: E402
from probmoe.integrations.transformers.controls import after_step  # noqa: E402
from probmoe.integrations.transformers.model import patched_gates  # noqa: E402
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402
from probmoe.integrations.vllm import routing, settings  # noqa: E402

NAME = "relu-topk"
JITTER = 0.5


class ReluTopK(Method):
    name = NAME
    summary = "top-k of r (noisy in training), weights ReLU(r)"
    groups = "never"

    def _routed(self, logits, key, k):
        idx = key.topk(k, dim=-1).indices  # [T, k]
        w = torch.relu(logits.float()).gather(-1, idx)  # [T, k], differentiable
        return Routed(w, idx, idx, w.detach() > 0)

    def train_rule(self, logits, gate):
        noise = torch.randn(logits.shape, generator=gate.generator, device=logits.device) * JITTER
        return self._routed(logits, logits.detach().float() + noise, gate.top_k)

    def infer_rule(self, logits, gate):
        return self._routed(logits, logits.float(), gate.k or gate.top_k)

    def serving(self, routing, top_k, num_experts, biased):
        return Serving(NAME, top_k, top_k, normalizes=False)


@pytest.fixture
def relu_topk():
    method = register_method(ReluTopK())
    yield method
    unregister_method(NAME)


def test_a_method_registered_here_trains_saves_reloads_serves_and_evaluates(relu_topk, tmp_path):
    torch.manual_seed(0)
    model = pt.patch_model(tiny_model("olmoe"), NAME)
    assert model.probmoe_plan.rules is relu_topk and model.probmoe_plan.routing is None

    # trains: the loss falls, the routers get gradients through ReLU(r)
    ids = torch.randint(3, 200, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for _ in range(6):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        gates = patched_gates(model)
        assert all(g.weight.grad is not None and g.weight.grad.abs().sum() > 0 for g in gates)
        opt.step()
        after_step(model)
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]

    # evaluates: in eval the gate routes by the method's inference rule, exactly
    model.eval()
    gate = patched_gates(model)[0]
    captured = {}
    hook = gate.register_forward_hook(lambda m, args, out: captured.update(out=out))
    with torch.no_grad():
        logits_out = model(input_ids=ids).logits
    hook.remove()
    router_logits, weights, indices = captured["out"]
    expected = relu_topk.infer_rule(router_logits, Gate(top_k=2, num_experts=8))
    assert torch.equal(indices, expected.indices) and torch.equal(weights, expected.weights.to(weights.dtype))
    assert describe(model) == f"{NAME} (top-2)"

    # saves and reloads: the settings file names the method; the reloaded model routes the same
    model.save_pretrained(tmp_path)
    reloaded = pt.from_pretrained(tmp_path).eval()
    assert reloaded.probmoe_plan == model.probmoe_plan
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, logits_out)

    # serves: the vLLM plugin's rule for the checkpoint is the method's inference rule
    rule = settings.serving_rule(str(tmp_path), reloaded.config)
    assert (rule.kind, rule.slots, rule.kmin, rule.normalize, rule.method, rule.stock) == (
        NAME,
        2,
        2,
        False,
        NAME,
        False,
    )
    fn = routing.routing_function(rule, None)
    w, served_ids = fn(hidden_states=None, gating_output=router_logits, topk=2, renormalize=False)
    assert served_ids.dtype == torch.int32 and torch.equal(served_ids.long(), expected.indices)
    assert torch.equal(w, expected.weights)


def test_the_registered_method_takes_only_the_options_it_declares(relu_topk):
    with pytest.raises(ValueError, match="jitter_eps applies only to method 'sparsemixer', not to 'relu-topk'"):
        pt.patch_model(tiny_model("olmoe"), NAME, jitter_eps=0.1)
    with pytest.raises(ValueError, match="k applies only to the methods"):
        pt.patch_model(tiny_model("olmoe"), NAME, k=2)
    with pytest.raises(ValueError, match="method 'relu-topk' is not defined for model type 'deepseek_v3'"):
        pt.patch_model(tiny_model("deepseek_v3"), NAME)


def test_an_option_without_a_field_is_refused(relu_topk):
    odd = type("Odd", (ReluTopK,), {"name": "odd-test", "options": {"width": 3}})()
    register_method(odd)
    try:
        with pytest.raises(ValueError, match="declares the option 'width', which RoutingOptions has no field"):
            pt.patch_model(tiny_model("olmoe"), "conventional")
    finally:
        unregister_method("odd-test")


def test_unregistered_it_is_refused(relu_topk, tmp_path):
    model = pt.patch_model(tiny_model("olmoe"), NAME)
    model.save_pretrained(tmp_path)
    unregister_method(NAME)
    try:
        with pytest.raises(ValueError, match="method must be one of .*got 'relu-topk'"):
            pt.from_pretrained(tmp_path)
    finally:
        register_method(relu_topk)
    assert get_method(NAME) is relu_topk
