"""The SGLang model package without SGLang (main environment; SGLang does not run on this CPU).

``served`` is exercised on a stand-in of an SGLang model module (``FAKE``: its ``TopK`` and
``FusedMoE`` take sglang 0.5.23's keywords, its ``TopK`` calls a ``custom_routing_function`` as
sglang's ``select_experts`` does, its model builds them per layer as ``sglang.srt.models.olmoe``
does). Checked: every method on every family routes through the TopK the package builds as the
patched transformers gate does in eval, slot for slot, and as ``probmoe.route`` does; the width,
the forced standard output format and the per-layer aux-free bias; the state filter on the
tensors a saved checkpoint holds; every refusal.
"""

import types

import pytest
import torch

import probmoe
from probmoe.integrations import model_families
from probmoe.integrations.sglang import ARCHITECTURES, FAMILIES, MODULES, served
from probmoe.integrations.vllm import routing, settings
from probmoe.methods import get_method, methods

pt = pytest.importorskip("probmoe.integrations.transformers")
from transformers import AutoConfig  # noqa: E402

from probmoe.integrations.transformers.gate import PatchedGate  # noqa: E402
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402

STANDARD = "TopKOutputFormat.STANDARD"  # stands in for sglang's enum member

FAKE = """
import torch

SHARED_SLOTS = 0     # sglang: get_model().shared_experts.num_shared_topk_slots
FUSED_SHARED = 0     # Qwen2-MoE's num_fused_shared_experts
BACKEND = None       # the experts' runner backend
MEGA = False         # Qwen's _use_mega_moe


class TopK(torch.nn.Module):
    def __init__(self, top_k, *, layer_id, renormalize=True, use_grouped_topk=False,
                 custom_routing_function=None, output_format=None):
        super().__init__()
        self.renormalize = renormalize
        self.topk_config = types.SimpleNamespace(
            top_k=top_k + SHARED_SLOTS, num_shared_topk_slots=SHARED_SLOTS, layer_id=layer_id,
            custom_routing_function=custom_routing_function, output_format=output_format,
            runner_backend=None)

    def bind_runner_backend(self, backend):
        self.topk_config.runner_backend = backend

    def forward(self, hidden_states, router_logits):  # sglang's select_experts, its custom branch
        c = self.topk_config
        w, ids = c.custom_routing_function(hidden_states=hidden_states, gating_output=router_logits,
                                           topk=c.top_k, renormalize=self.renormalize)
        return w, ids, router_logits


class FusedMoE(torch.nn.Module):
    def __init__(self, num_experts, hidden_size, intermediate_size, layer_id, top_k=None,
                 num_fused_shared_experts=0, prefix=""):
        super().__init__()
        self.top_k, self.runner_backend = top_k, BACKEND


def get_moe_impl_class(quant_config):
    return FusedMoE


class Block(torch.nn.Module):
    def __init__(self, config, layer_id, qwen):
        super().__init__()
        self.topk = TopK(top_k=config.num_experts_per_tok, layer_id=layer_id, renormalize=False)
        n = getattr(config, "num_experts", None) or config.num_local_experts
        impl = get_moe_impl_class(None) if qwen else FusedMoE
        kw = dict(num_fused_shared_experts=FUSED_SHARED) if qwen else {}
        self.experts = impl(num_experts=n, top_k=config.num_experts_per_tok, hidden_size=config.hidden_size,
                            intermediate_size=8, layer_id=layer_id, **kw)
        self.topk.bind_runner_backend(self.experts.runner_backend)
        self._use_mega_moe = MEGA


class ForCausalLM(torch.nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__()
        qwen = config.model_type.startswith("qwen")
        self.layers = torch.nn.ModuleList(Block(config, i, qwen) for i in range(config.num_hidden_layers))

    def load_weights(self, weights):
        self.loaded = [name for name, _ in weights]
"""


@pytest.fixture
def fake():
    module = types.ModuleType("fake_sglang_model")
    module.types = types
    exec(FAKE, module.__dict__)
    return module


def _served(module):
    return served.served(module.ForCausalLM, module, STANDARD)


def _saved(tmp_path, family, method, **kw):
    model = tiny_model(family)
    pt.patch_model(model, method, **kw)
    if kw.get("balance"):
        for i, m in enumerate(x for x in model.modules() if "probmoe_bias" in x._buffers):
            m.probmoe_bias.copy_(torch.linspace(-1, 1, m.probmoe_bias.numel()) * (i + 1))
    path = tmp_path / f"{family}-{method}-{'-'.join(map(str, kw.values()))}"
    model.save_pretrained(path)
    return str(path)


def test_families_are_the_tables_with_an_sglang_module():
    assert set(FAMILIES) == set(MODULES) <= set(model_families.TABLE)
    assert set(FAMILIES) <= set(settings.FAMILIES)  # the reader takes every family served here
    assert tuple(model_families.TABLE[t].architecture for t in FAMILIES) == ARCHITECTURES
    assert "flex_olmo" not in FAMILIES  # sglang 0.5.23 has no FlexOlmo module


# --- every method on every family, through the TopK the package builds ---------------------------

ROUTED_FAMILIES = [t for t in FAMILIES if not model_families.TABLE[t].grouped]  # DeepSeek-V3: below


def _cases():
    for family in ROUTED_FAMILIES:
        for name in methods():
            method = get_method(name)
            if method.groups == "only":
                continue
            kws = [{}]
            if name == "probmoe-dynamic":
                kws = [{"kmin": 1, "kmax": 4}, {"kmin": 2, "kmax": 6}]
            elif name == "probmoe":
                kws = [{}, {"k": 3}]
            if method.balances:
                kws.append({**kws[0], "balance": "aux-free"})
            for kw in kws:
                # the default run: every case on OLMoE, one per other family; the rest (-m slow) in CI
                quick = family == "olmoe" or (name == "probmoe-dynamic" and kw.get("balance"))
                marks = () if quick else (pytest.mark.slow,)
                yield pytest.param(
                    family, name, kw, marks=marks, id=f"{family}-{name}-{'-'.join(map(str, kw.values()))}"
                )


@pytest.mark.parametrize("family,method,kw", list(_cases()))
def test_served_topk_routes_as_the_patched_gate(tmp_path, fake, family, method, kw):
    """The checkpoint's rule, in the TopK the package builds, routes the patched model's own router
    logits as its patched gate does in eval: the same expert in every slot with the same weight."""
    path = _saved(tmp_path, family, method, **kw)
    config = AutoConfig.from_pretrained(path)  # as SGLang reads it: _name_or_path is the directory
    model = _served(fake)(config)
    rule = model.probmoe_rule
    assert rule == settings.serving_rule(path, config)
    reference = pt.from_pretrained(path).eval()
    gates = [m for m in reference.modules() if isinstance(m, PatchedGate)]
    hidden = torch.randn(40, config.hidden_size, generator=torch.Generator().manual_seed(8)) * 3
    for layer, (block, gate) in enumerate(zip(model.layers, gates, strict=True)):
        c = block.topk.topk_config
        assert c.layer_id == layer and c.top_k == rule.slots and block.experts.top_k == rule.slots
        if rule.stock:  # SGLang's own top-k routes it (of width k where k is not the config's)
            assert c.custom_routing_function is None and c.output_format is None
            fn = routing.routing_function(rule, None)  # the stock top-k, the rule it stands for
            w, ids = fn(hidden_states=hidden, gating_output=gate(hidden)[0], topk=c.top_k, renormalize=False)
        else:
            assert c.output_format == STANDARD and c.custom_routing_function.probmoe_rule is rule
            w, ids, _ = block.topk(hidden, gate(hidden)[0])
        logits, ref_w, ref_ids = gate(hidden)
        assert ids.dtype == torch.int32 and w.dtype == torch.float32 and ids.shape == (40, rule.slots)
        assert torch.equal(ids.long(), ref_ids), (layer, ids[:2], ref_ids[:2])
        torch.testing.assert_close(w, ref_w.float(), rtol=1e-6, atol=1e-7)
        if rule.bias is not None:  # each layer routes with its own bias
            assert c.custom_routing_function is not None
            assert not torch.equal(ids, routing.routing_function(rule, None)(hidden, logits, 0, False)[1])


@pytest.mark.parametrize("kmin,kmax", [(1, 4), (2, 6)])
def test_served_dynamic_k_is_probmoe_route(tmp_path, fake, kmin, kmax):
    path = _saved(tmp_path, "olmoe", "probmoe-dynamic", kmin=kmin, kmax=kmax)
    model = _served(fake)(AutoConfig.from_pretrained(path))
    logits = torch.randn(64, 8, generator=torch.Generator().manual_seed(1)) * 2
    w, ids, _ = model.layers[0].topk(torch.zeros(64, 64), logits)
    ref = probmoe.route(logits, probmoe.RoutingConfig(8, kmin=kmin, kmax=kmax), training=False)
    assert torch.equal(ids.long(), ref.indices) and torch.equal(w, ref.weights)
    assert len(set((w > 0).sum(-1).tolist())) > 1  # rows of several sizes, unused slots at weight 0


def test_deepseek_v3_is_stock_or_refused(tmp_path, fake):
    for method, kw in (("conventional", {}), ("conventional", {"balance": "aux-free"})):
        path = _saved(tmp_path, "deepseek_v3", method, **kw)
        model = _served(fake)(AutoConfig.from_pretrained(path))
        assert model.probmoe_rule.stock and model.layers[0].topk.topk_config.custom_routing_function is None
    path = _saved(tmp_path, "deepseek_v3", "probmoe")  # its rule drops the groups and the bias: vLLM's plugin only
    with pytest.raises(
        settings.ServingSettingsError, match=r"method 'probmoe' on model type 'deepseek_v3' routes without"
    ):
        _served(fake)(AutoConfig.from_pretrained(path))
    path = _saved(tmp_path, "deepseek_v3", "probmoe-grouped")
    with pytest.raises(settings.ServingSettingsError, match=r"probmoe_routing\.json: method 'probmoe-grouped'"):
        _served(fake)(AutoConfig.from_pretrained(path))


def test_checkpoint_without_settings_is_stock(tmp_path, fake):
    tiny_model("mixtral").save_pretrained(tmp_path)
    model = _served(fake)(AutoConfig.from_pretrained(tmp_path))
    c = model.layers[1].topk.topk_config
    assert model.probmoe_rule is None and c.custom_routing_function is None and c.top_k == 2


def test_module_is_restored_after_the_build(tmp_path, fake):
    stock = (fake.TopK, fake.FusedMoE, fake.get_moe_impl_class)
    path = _saved(tmp_path, "qwen2_moe", "remoe")
    _served(fake)(AutoConfig.from_pretrained(path))
    assert (fake.TopK, fake.FusedMoE, fake.get_moe_impl_class) == stock
    fake.FUSED_SHARED = 1
    with pytest.raises(RuntimeError, match="fuses shared experts"):
        _served(fake)(AutoConfig.from_pretrained(path))
    assert (fake.TopK, fake.FusedMoE, fake.get_moe_impl_class) == stock  # also after a refusal


# --- the state filter -----------------------------------------------------------------------------


def test_load_weights_drops_exactly_the_routing_state(tmp_path, fake):
    from safetensors import safe_open

    for method, kw in (("remoe", {}), ("defaultmoe", {"balance": "aux-free"})):
        path = _saved(tmp_path, "olmoe", method, **kw)
        files = {}
        for name in ("model.safetensors", settings.STATE_FILENAME):
            with safe_open(f"{path}/{name}", framework="pt") as f:
                files[name] = list(f.keys())
        state = files[settings.STATE_FILENAME]
        assert state and all(".probmoe_" in k for k in state)
        model = _served(fake)(AutoConfig.from_pretrained(path))
        weights = [(k, None) for k in files["model.safetensors"] + state]
        model.load_weights(iter(weights))
        assert model.loaded == files["model.safetensors"]  # every weight, in order; no state
    assert not served.is_state("model.layers.0.mlp.gate.weight") and served.is_state("a.probmoe_x")


# --- refusals -------------------------------------------------------------------------------------


def test_refuses_a_model_path_that_is_not_a_directory(fake):
    config = tiny_model("olmoe").config
    config._name_or_path = "allenai/OLMoE-1B-7B-0924"
    with pytest.raises(settings.ServingSettingsError, match="'allenai/OLMoE-1B-7B-0924' is not a local directory"):
        _served(fake)(config)


def test_refuses_a_damaged_settings_file(tmp_path, fake):
    path = _saved(tmp_path, "olmoe", "probmoe-dynamic", kmin=1, kmax=4)
    f = f"{path}/{settings.FILENAME}"
    text = open(f).read()
    open(f, "w").write(text.replace('"kmax": 4', '"kmax": 5'))  # a hand edit
    with pytest.raises(settings.ServingSettingsError, match="sha256") as e:
        _served(fake)(AutoConfig.from_pretrained(path))
    assert f in str(e.value)


@pytest.mark.parametrize(
    "setup,message",
    [
        ({"SHARED_SLOTS": 1}, "fuses shared experts into the routed top-k"),
        ({"BACKEND": types.SimpleNamespace(is_triton_kernels=lambda: True)}, "triton_kernels runner"),
        ({"MEGA": True}, "mega-MoE backend"),
    ],
)
def test_refuses_an_sglang_setup_the_rule_cannot_run_in(tmp_path, fake, setup, message):
    path = _saved(tmp_path, "olmoe", "sparsemixer")
    for name, value in setup.items():
        setattr(fake, name, value)
    with pytest.raises(RuntimeError, match=f"fake_sglang_model .*{message}.*sglang 0.5.23"):
        _served(fake)(AutoConfig.from_pretrained(path))


def test_refuses_a_topk_built_another_way(tmp_path, fake):
    path = _saved(tmp_path, "olmoe", "remoe")
    rule = settings.serving_rule(path, AutoConfig.from_pretrained(path))
    with served.routed(fake, rule, STANDARD), pytest.raises(RuntimeError, match="positional arguments"):
        fake.TopK(2, layer_id=0)
    with served.routed(fake, rule, STANDARD), pytest.raises(RuntimeError, match="grouped TopK"):
        fake.TopK(top_k=2, layer_id=0, use_grouped_topk=True)
    with pytest.raises(RuntimeError, match="built no TopK layer"):
        served.check(torch.nn.Linear(1, 1), [], "fake_sglang_model")


def test_refuses_an_aux_free_bias_it_cannot_place(tmp_path, fake):
    path = _saved(tmp_path, "olmoe", "conventional", balance="aux-free")
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"), pytest.raises(RuntimeError, match="--load-format layered"):
        _served(fake)(config)
    rule = settings.serving_rule(path, config)
    partial = settings.Rule(**{**rule.__dict__, "bias": {0: rule.bias[0]}})
    with served.routed(fake, partial, STANDARD), pytest.raises(settings.ServingSettingsError, match="of layer 1"):
        fake.TopK(top_k=2, layer_id=1)
