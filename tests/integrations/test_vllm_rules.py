"""The vLLM plugin's routing functions and settings reader, without vLLM (main environment).

The routing functions are checked against what the transformers integration computes at eval
(its gate's code paths: ``probmoe.route``, ``balance``, ``sparsemixer``, ``remoe``), and for what
a server needs: every row's ids distinct, unused slots at weight 0, no host synchronisation or
data-dependent branch (``torch.compile(fullgraph=True)`` refuses both). The reader is checked on
files ``save_pretrained`` of a patched model wrote, and on every kind of bad file.
"""

import json
import os

import pytest
import torch

import probmoe
from probmoe.integrations import settings_file
from probmoe.integrations.vllm import routing, settings

pt = pytest.importorskip("probmoe.integrations.transformers")
from probmoe.integrations.transformers import balance, remoe, sparsemixer  # noqa: E402
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402


def _logits(t=64, n=8, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, n, generator=g) * scale


def _distinct(ids):
    s = ids.long().sort(dim=-1).values
    return bool((s[:, 1:] != s[:, :-1]).all())


def _by_expert(w, ids, n):
    """[T, slots] weights at ids -> [T, N] dense (0 where unused)."""
    return torch.zeros(w.shape[0], n).scatter_add(-1, ids.long(), w.float())


@pytest.mark.parametrize("kmin,kmax", [(1, 4), (2, 6), (1, 8), (3, 3)])
@pytest.mark.parametrize("normalize", [False, True])
def test_range_map_is_probmoe_route_eval(kmin, kmax, normalize):
    r = _logits()
    w, ids = routing.range_map(r, None, kmin, kmax, normalize)
    ref = probmoe.route(r, probmoe.RoutingConfig(8, kmin=kmin, kmax=kmax, normalize=normalize), training=False)
    used = w > 0
    assert torch.equal(used.sum(-1), ref.mask.sum(-1))
    assert torch.equal(_by_expert(w, ids, 8), _by_expert(ref.weights, ref.indices, 8))
    assert _distinct(ids) and ids.dtype == torch.int32 and w.dtype == torch.float32
    assert (w[~used] == 0).all()
    # route's contract (docs/router.md): a range's unused slots hold the next experts by logit
    assert torch.equal(ids.long(), ref.indices) and torch.equal(w, ref.weights)
    if kmin < kmax:  # the logits give rows of several sizes
        assert len(set(used.sum(-1).tolist())) > 1


@pytest.mark.parametrize("normalize", [False, True])
def test_range_map_with_bias_is_the_patched_gate(normalize):
    r, b = _logits(seed=1), torch.randn(8, generator=torch.Generator().manual_seed(2))
    w, ids = routing.range_map(r, b, 1, 4, normalize)
    ref = probmoe.route(r + b, probmoe.RoutingConfig(8, kmin=1, kmax=4), training=False)  # as gate.probmoe_route
    ref_w = balance.probmoe_weights(ref, r, r + b, "softmax", normalize)
    assert torch.equal(_by_expert(w, ids, 8), _by_expert(ref_w, ref.indices, 8))
    unbiased = routing.range_map(r, None, 1, 4, normalize)[1]
    assert not torch.equal(ids, unbiased)  # the bias moves the selection
    assert _distinct(ids)


@pytest.mark.parametrize("normalize", [False, True])
def test_topk_bias_is_biased_topk(normalize):
    r, b = _logits(seed=3), torch.randn(8, generator=torch.Generator().manual_seed(4)) * 0.1
    w, ids = routing.topk_bias(r, b, 2, normalize)
    ref_w, ref_ids = balance.biased_topk(r, 2, normalize, "softmax", b)
    assert torch.equal(ids.long(), ref_ids) and torch.equal(w, ref_w)
    w0, ids0 = routing.topk_bias(r, None, 2, normalize)  # no bias: softmax + topk, as stock
    probs = torch.softmax(r, -1)
    top = probs.topk(2, -1)
    assert torch.equal(ids0.long(), top.indices)
    assert torch.equal(w0, top.values / top.values.sum(-1, keepdim=True) if normalize else top.values)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("eps", [0.01, 0.3])
def test_sparsemixer_eval_is_sparsemixer(k, eps):
    r = _logits(seed=5, scale=0.5)
    w, ids = routing.sparsemixer_eval(r, k, eps)
    ref_w, ref_ids = sparsemixer.sparsemixer_weights(r, k, training=False, jitter_eps=eps)
    assert torch.equal(ids.long(), ref_ids) and torch.equal(w, ref_w.detach())
    assert _distinct(ids)


def test_relu_all_is_remoe_eval():
    r = _logits(seed=6)
    w, ids = routing.relu_all(r)
    ref = remoe.remoe_gates(r, 2, torch.zeros(3), 2, training=False)
    assert torch.equal(w, ref) and torch.equal(ids.long(), torch.arange(8).expand(64, 8))


RULES = [
    settings.Rule("topk", 2, 2, True, 8, "conventional", "x", {0: [0.1] * 8}),
    settings.Rule("range", 4, 1, False, 8, "probmoe-dynamic", "x"),
    settings.Rule("range", 4, 1, True, 8, "probmoe-dynamic", "x", {0: [0.0, 0.5] * 4}),
    settings.Rule("sparsemixer", 2, 2, False, 8, "sparsemixer", "x"),
    settings.Rule("remoe", 8, 0, False, 8, "remoe", "x"),
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.kind}-{r.bias is not None}")
def test_routing_function_has_no_host_sync_and_distinct_ids(rule):
    """fullgraph compilation fails on ``.item()``, ``.tolist()``, ``nonzero`` or a Python branch on
    a tensor's value: what a CUDA graph cannot capture."""
    torch._dynamo.reset()
    bias = None if rule.bias is None else torch.tensor(rule.bias[0])
    fn = routing.routing_function(rule, bias)
    r = _logits(t=33, seed=7)
    eager = fn(hidden_states=None, gating_output=r, topk=2, renormalize=False)
    compiled = torch.compile(fn, fullgraph=True, backend="eager", dynamic=True)
    for t in (33, 5):  # one graph for any token count
        out = compiled(hidden_states=None, gating_output=r[:t], topk=2, renormalize=False)
        assert torch.equal(out[0], eager[0][:t]) and torch.equal(out[1], eager[1][:t])
    w, ids = eager
    assert w.shape == ids.shape == (33, rule.slots)
    assert _distinct(ids)
    assert (w >= 0).all()


# --- the settings reader, on files the transformers integration wrote ----------------------------


def _saved(tmp_path, family="olmoe", method="probmoe-dynamic", **kw):
    model = tiny_model(family)
    pt.patch_model(model, method, **kw)
    if kw.get("balance"):
        for m in model.modules():
            if "probmoe_bias" in m._buffers:
                m.probmoe_bias.copy_(torch.linspace(-1, 1, 8))
    path = tmp_path / f"{family}-{method}"
    model.save_pretrained(path)
    return str(path), model.config


@pytest.mark.parametrize(
    "method,kw,kind,slots,kmin",
    [
        ("probmoe-dynamic", {"kmin": 1, "kmax": 4}, "range", 4, 1),
        ("probmoe", {}, "topk", 2, 2),
        ("probmoe", {"k": 3}, "topk", 3, 3),
        ("conventional", {}, "topk", 2, 2),
        ("defaultmoe", {}, "topk", 2, 2),
        ("remoe", {}, "remoe", 8, 0),
        ("sparsemixer", {}, "sparsemixer", 2, 2),
    ],
)
def test_rule_of_saved_checkpoint(tmp_path, method, kw, kind, slots, kmin):
    path, config = _saved(tmp_path, method=method, **kw)
    rule = settings.serving_rule(path, config)
    assert (rule.kind, rule.slots, rule.kmin, rule.method, rule.bias) == (kind, slots, kmin, method, None)
    assert rule.stock == (kind == "topk")


def test_rule_reads_aux_free_bias(tmp_path):
    path, config = _saved(tmp_path, method="conventional", balance="aux-free")
    rule = settings.serving_rule(path, config)
    assert rule.kind == "topk" and not rule.stock and sorted(rule.bias) == [0, 1]
    assert rule.bias[1] == pytest.approx(torch.linspace(-1, 1, 8).tolist())


def test_rule_of_stock_checkpoint_is_none(tmp_path):
    model = tiny_model("olmoe")
    model.save_pretrained(tmp_path)
    assert settings.serving_rule(str(tmp_path), model.config) is None


def _rewrite(path, **changes):
    """Change fields of the settings file and re-sign it (a file a program wrote wrongly, not a hand edit)."""
    f = os.path.join(path, settings.FILENAME)
    data = json.load(open(f))
    for name, value in changes.items():  # the routing options are fields of "options"
        (data if name in data else data["options"])[name] = value
    data["sha256"] = settings_file.digest(data)
    json.dump(data, open(f, "w"))
    return f


def test_bad_settings_files(tmp_path):
    path, config = _saved(tmp_path, kmin=1, kmax=4)
    f = os.path.join(path, settings.FILENAME)
    good = open(f).read()

    def error():
        with pytest.raises(settings.ServingSettingsError) as e:
            settings.serving_rule(path, config)
        return str(e.value)

    open(f, "w").write(good[:40])
    assert f in error() and "unreadable" in error()
    open(f, "w").write(good.replace('"kmax": 4', '"kmax": 5'))
    assert "sha256" in error()
    open(f, "w").write(good)
    routing_dict = json.load(open(f))["routing"]
    _rewrite(path, routing=dict(routing_dict, kmax=9))
    assert "kmax = 9 is above the expert count num_experts = 8 (allowed: 1..8)" in error()
    open(f, "w").write(good)
    _rewrite(path, method="top-3")
    assert "method must be one of" in error() and "'top-3'" in error()
    open(f, "w").write(good)
    _rewrite(path, model_type="mixtral")
    assert "does not match config.json's 'olmoe'" in error()
    open(f, "w").write(good)
    _rewrite(path, num_experts=16, routing=dict(routing_dict, num_experts=16))
    assert "num_experts = 16 but config.json has num_experts = 8" in error()
    open(f, "w").write(good)
    _rewrite(path, balance="aux-free", balance_rate=0.1)
    assert "probmoe_state.safetensors (the selection bias) is missing" in error()


def test_grouped_family_rules(tmp_path):
    """DeepSeek-V3 (tests/integrations/test_vllm_deepseek.py routes them): the top-k methods stock, the
    ProbMoE methods their own rule without groups, the grouped MAP refused."""
    path, config = _saved(tmp_path, family="deepseek_v3", method="probmoe-grouped")
    with pytest.raises(settings.ServingSettingsError, match="method 'probmoe-grouped' on model type 'deepseek_v3'"):
        settings.serving_rule(path, config)
    path, config = _saved(tmp_path, family="deepseek_v3", method="conventional", balance="aux-free")
    assert settings.serving_rule(path, config).stock  # its bias is the stock e_score_correction_bias
    path, config = _saved(tmp_path, family="deepseek_v3", method="probmoe", balance="aux-free")
    rule = settings.serving_rule(path, config)  # there the bias is a logit shift: not the stock rule
    assert not rule.stock and rule.ungrouped and rule.correction_bias and rule.scores == "sigmoid"
    path, config = _saved(tmp_path, family="deepseek_v3", method="conventional")
    assert settings.serving_rule(path, config).stock
    _rewrite(path, model_type="gpt_oss")
    config.model_type = "gpt_oss"
    with pytest.raises(settings.ServingSettingsError, match="model type 'gpt_oss' has no probmoe serving support"):
        settings.serving_rule(path, config)


@pytest.mark.parametrize(
    "family,method,kw",
    [
        ("olmoe", "probmoe-dynamic", {"kmin": 1, "kmax": 4}),
        ("olmoe", "probmoe-dynamic", {"kmin": 2, "kmax": 6, "balance": "aux-free"}),
        ("olmoe", "probmoe", {"balance": "aux-free"}),
        ("olmoe", "topk-marginal", {"k": 3}),
        ("olmoe", "conventional", {"balance": "aux-free"}),
        ("olmoe", "defaultmoe", {"balance": "aux-free"}),
        ("olmoe", "sparsemixer", {}),
        ("olmoe", "remoe", {}),
        ("mixtral", "probmoe-dynamic", {"kmin": 2, "kmax": 6, "balance": "aux-free"}),  # always renormalises
        ("mixtral", "probmoe", {"balance": "aux-free"}),
        ("mixtral", "sparsemixer", {}),
    ],
)
def test_rule_routes_as_the_patched_gate(tmp_path, family, method, kw):
    """The rule read from a saved checkpoint routes the patched model's own router logits as its
    patched gate does in eval: the same experts with the same weights, token by token."""
    path, config = _saved(tmp_path, family=family, method=method, **kw)
    model = pt.from_pretrained(path).eval()
    rule = settings.serving_rule(path, config)
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(40, config.hidden_size, generator=g) * 3
    from probmoe.integrations.transformers.gate import PatchedGate

    for layer, block in enumerate(m for m in model.modules() if isinstance(m, PatchedGate)):
        logits, ref_w, ref_ids = block(hidden)
        bias = None if rule.bias is None else torch.tensor(rule.bias[layer])
        w, ids = routing.routing_function(rule, bias)(
            hidden_states=hidden, gating_output=logits, topk=2, renormalize=False
        )
        assert _distinct(ids)
        torch.testing.assert_close(_by_expert(w, ids, 8), _by_expert(ref_w.float(), ref_ids, 8), rtol=1e-6, atol=1e-7)
