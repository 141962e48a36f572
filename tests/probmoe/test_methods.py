"""The registry of routing methods (``probmoe.methods``): what it holds, what it refuses, and the
built-in methods' declarations against the names the integrations used to list."""

import pytest
import torch

from probmoe.methods import Gate, Method, Routed, get_method, methods, register_method, unregister_method

BUILT_IN = (
    "conventional",
    "frozen",
    "densemixer",
    "probmoe",
    "probmoe-dynamic",
    "sample-dense-ste",
    "topk-marginal",
    "defaultmoe",
    "sparsemixer",
    "remoe",
    "probmoe-grouped",
)


def test_built_in_methods_in_order():
    assert methods()[: len(BUILT_IN)] == BUILT_IN
    assert all(get_method(name).name == name for name in BUILT_IN)


def test_declarations():
    top_k = [m for m in BUILT_IN if get_method(m).sizes == "top-k"]
    assert top_k == ["conventional", "frozen", "densemixer", "defaultmoe", "sparsemixer", "remoe"]
    assert [m for m in BUILT_IN if get_method(m).sizes == "range"] == ["probmoe-dynamic"]
    assert {m: get_method(m).estimator for m in BUILT_IN if get_method(m).estimator} == {
        "probmoe": "probmoe",
        "probmoe-dynamic": "probmoe",
        "sample-dense-ste": "sample-dense-ste",
        "topk-marginal": "topk-marginal",
        "probmoe-grouped": "probmoe",
    }
    assert [m for m in BUILT_IN if get_method(m).groups == "never"] == ["sparsemixer", "remoe"]
    assert [m for m in BUILT_IN if not get_method(m).balances] == ["sparsemixer", "remoe"]
    assert {m: get_method(m).experts for m in BUILT_IN if get_method(m).experts} == {
        "probmoe-dynamic": "skip",
        "defaultmoe": "default",
        "remoe": "skip-weight",
    }
    assert dict(get_method("remoe").options) == {"l1_coef": 1e-8, "l1_rate": 1.2, "l1_layers": "sum"}
    assert dict(get_method("sparsemixer").options) == {"jitter_eps": 0.01}
    assert [m for m in BUILT_IN if get_method(m).state_buffer] == ["remoe"]
    assert [m for m in BUILT_IN if not get_method(m).trains_router] == ["frozen"]
    stock_in_eval = [m for m in BUILT_IN if get_method(m).stock(False)]
    assert stock_in_eval == ["conventional", "frozen", "densemixer", "defaultmoe"]
    assert [m for m in stock_in_eval if get_method(m).stock(True)] == ["conventional", "frozen"]


def test_unknown_name_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"method must be one of 'conventional', .*'probmoe-grouped'.*; got 'nope'"):
        get_method("nope")
    with pytest.raises(ValueError, match="got None"):
        get_method(None)


class _Plain(Method):
    name = "plain-test"


def test_register_refuses_bad_declarations():
    with pytest.raises(ValueError, match="registered already"):
        register_method(get_method("remoe"))
    with pytest.raises(ValueError, match="instance of probmoe.methods.Method"):
        register_method("remoe")
    for attrs, message in (
        (dict(name="Bad Name"), "method.name must be a non-empty lower-case string"),
        (dict(sizes="some"), "sizes must be one of"),
        (dict(groups="maybe"), "groups must be one of"),
        (dict(experts="all"), "experts must be one of"),
        (dict(sizes="exact-k"), "give its estimator"),
    ):
        bad = type("Bad", (_Plain,), attrs)()
        with pytest.raises(ValueError, match=message):
            register_method(bad)
    assert "plain-test" not in methods()


def test_register_and_unregister():
    register_method(_Plain())
    try:
        assert methods()[-1] == "plain-test" and isinstance(get_method("plain-test"), _Plain)
        with pytest.raises(NotImplementedError, match="'plain-test' has no training rule"):
            get_method("plain-test").rule(torch.zeros(2, 4), Gate(top_k=1, num_experts=4), True)
    finally:
        unregister_method("plain-test")
    assert "plain-test" not in methods()


@pytest.mark.parametrize("name", ["conventional", "densemixer", "defaultmoe"])
def test_top_k_inference_rule_is_softmax_topk(name):
    r = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    out = get_method(name).infer_rule(r, Gate(top_k=2, num_experts=8, normalize=True))
    top = torch.softmax(r, -1).topk(2, -1)
    assert torch.equal(out.indices, top.indices)
    assert torch.equal(out.weights, top.values / top.values.sum(-1, keepdim=True))
    assert isinstance(out, Routed) and out.used_mask.all()


def test_remoe_inference_rule_is_relu_over_all_experts():
    r = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    out = get_method("remoe").infer_rule(r, Gate(top_k=2, num_experts=8))
    assert torch.equal(out.weights, torch.relu(r)) and torch.equal(out.indices, torch.arange(8).expand(16, 8))
    assert torch.equal(out.used_mask, r > 0)


def test_remoe_control_moves_lambda():
    remoe = get_method("remoe")
    options = type("O", (), {"l1_coef": 1e-3, "l1_rate": 2.0})()
    state = torch.tensor(remoe.initial_state(options))
    state[1:] = torch.tensor([0.5, 1.0])  # mean sparsity 0.5 over one forward, below Q = 1 - 2/8
    assert remoe.after_step([state], top_k=2, num_experts=8, options=options) == {
        "remoe_sparsity": 0.5,
        "remoe_l1_coef": pytest.approx(2e-3),
    }
    assert remoe.after_step([state], top_k=2, num_experts=8, options=options) == {}  # no forward since
