"""probmoe.integrations.transformers: patching the softmax-gated families with every method.

Tiny random models (hidden 64, 2 layers, 8 experts, top-2, vocab 256): training reduces the loss
and reaches the routers (frozen: bit-identical), eval of the exactly-k methods equals the stock
model, generate() works with the KV cache, unpatch restores stock routing bit for bit, and every
bad input is a ValueError naming the argument.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

from training_steps import train_steps

import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.testing import tiny_model

FAMILIES = pt.SUPPORTED
EXACT_K = ("conventional", "frozen", "densemixer", "probmoe", "sample-dense-ste", "topk-marginal")


def batch(seed=0, shape=(4, 16)):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, shape, generator=g)


def routers(model):
    return (
        [b.gate for b in model.probmoe_family.blocks(model)]
        if pt.is_patched(model)
        else [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
    )


def test_supported_and_methods():
    assert FAMILIES == ("olmoe", "qwen2_moe", "qwen3_moe", "mixtral", "flex_olmo")
    assert pt.METHODS == (
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
    )


def test_import_probmoe_does_not_import_transformers():
    code = (
        "import sys, probmoe, probmoe.integrations; "
        "assert 'transformers' not in sys.modules, 'transformers imported'; print('ok')"
    )
    root = Path(__file__).resolve().parents[2]  # this checkout's probmoe, not an installed one
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", pt.METHODS)
def test_training_reduces_loss_and_reaches_routers(family, method):
    model = pt.patch_model(tiny_model(family), method, generator=torch.Generator().manual_seed(1))
    losses, before, after = train_steps(model, routers(model), batch(), method == "frozen")
    assert losses[-1] < losses[0] - 0.2, losses
    if method == "frozen":
        assert all(torch.equal(a, b) for a, b in zip(before, after))
        if family == "qwen2_moe":  # the shared expert's gate is not a router: it still trains
            assert all(b.shared_expert_gate.weight.requires_grad for b in model.probmoe_family.blocks(model))
    else:
        assert not any(torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", EXACT_K)
def test_eval_of_exactly_k_methods_equals_stock(family, method):
    stock, model = tiny_model(family).eval(), pt.patch_model(tiny_model(family), method).eval()
    x = batch(1)
    with torch.no_grad():
        want, got = stock(x).logits, model(x).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_kv_cache_matches_stock(family):
    stock, model = tiny_model(family).eval(), pt.patch_model(tiny_model(family), "probmoe").eval()
    prompt = batch(2, (2, 5))
    kw = dict(max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    want, got = stock.generate(prompt, **kw), model.generate(prompt, **kw)
    assert got.shape == (2, 11)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_dynamic_k_serves_a_stock_trained_model(family):
    model = pt.patch_model(tiny_model(family), "probmoe-dynamic", kmin=1, kmax=2).eval()
    out = model.generate(batch(3, (1, 4)), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 8)
    counts = [s["experts_per_token"] for s in pt.router_stats(model)]
    assert all(((c >= 1) & (c <= 2)).all() for c in counts)


def unpatch_cases():
    """Every method on a rotating family by default (every family covered); the full matrix is slow."""
    for i, method in enumerate(pt.METHODS):
        for j, family in enumerate(FAMILIES):
            marks = () if j == i % len(FAMILIES) else (pytest.mark.slow,)
            yield pytest.param(family, method, marks=marks, id=f"{method}-{family}")


@pytest.mark.parametrize("family,method", list(unpatch_cases()))
def test_unpatch_restores_stock_bit_for_bit(family, method):
    stock = tiny_model(family)
    model = tiny_model(family)
    classes = {n: type(m) for n, m in model.named_modules()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    pt.patch_model(model, method)
    x = batch(4)
    model.train()
    model(x, labels=x, output_router_logits=True).loss.backward()
    model.zero_grad(set_to_none=True)
    assert pt.unpatch_model(model) is model
    assert not pt.is_patched(model)
    assert {n: type(m) for n, m in model.named_modules()} == classes
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert not any(name.startswith("probmoe_") for m in model.modules() for name in vars(m))
    for mode in (True, False):
        stock.train(mode), model.train(mode)
        a = stock(x, labels=x, output_router_logits=True)
        b = model(x, labels=x, output_router_logits=True)
        assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
        assert all(torch.equal(p, q) for p, q in zip(a.router_logits, b.router_logits))


@pytest.mark.parametrize("family", FAMILIES)
def test_state_dict_keys_stay_stock(family):
    stock = tiny_model(family)
    model = pt.patch_model(tiny_model(family), "probmoe-dynamic")
    assert list(model.state_dict()) == list(stock.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in stock.named_parameters()]
    assert type(model).__name__ == type(stock).__name__


def test_patch_after_a_forward_keeps_router_logit_capture():
    model = tiny_model("olmoe")
    x = batch()
    model(x, output_router_logits=True)  # HF installs its capture hooks on the stock routers
    pt.patch_model(model, "probmoe")
    out = model.train()(x, labels=x, output_router_logits=True)
    assert len(out.router_logits) == 2 and out.aux_loss is not None


def test_patch_same_settings_is_a_no_op_and_other_settings_fail():
    model = pt.patch_model(tiny_model("qwen3_moe"), "probmoe", k=2)
    assert pt.patch_model(model, "probmoe") is model  # k=2 is the model's top-k: same plan
    with pytest.raises(ValueError, match="already patched"):
        pt.patch_model(model, "probmoe", k=3)
    with pytest.raises(ValueError, match="already patched"):
        pt.patch_model(model, "densemixer")


BAD = [
    (dict(method="bogus"), "method must be one of"),
    (dict(method="probmoe", k=9), "k must be in \\[1, 8\\]"),
    (dict(method="probmoe", k=0), "k must be an integer >= 1"),
    (dict(method="probmoe", k=2.0), "k must be an integer"),
    (dict(method="probmoe-dynamic", kmin=3, kmax=2), "kmin must be <= kmax"),
    (dict(method="probmoe-dynamic", kmax=9), "kmax must be in"),
    (dict(method="probmoe-dynamic", k=2), "k: method 'probmoe-dynamic' takes kmin and kmax"),
    (dict(method="probmoe", kmin=1, kmax=2), "kmin/kmax: method 'probmoe' routes exactly k"),
    (dict(method="conventional", k=2), "k applies only to the methods"),
    (dict(method="densemixer", backend="dp"), "backend and grad apply only"),
    (dict(method="probmoe", backend="gpu"), "backend must be one of"),
    (dict(method="probmoe", grad="fast"), "grad must be one of"),
    (dict(method="probmoe", aux_loss=-1.0), "aux_loss must be a finite number"),
    (dict(method="probmoe", z_loss=float("nan")), "z_loss must be a finite number"),
    (dict(method="probmoe", generator=0), "generator must be a torch.Generator"),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_bad_arguments_are_value_errors(kwargs, message):
    model = tiny_model("mixtral")
    with pytest.raises(ValueError, match=message):
        pt.patch_model(model, **kwargs)
    assert not pt.is_patched(model)


def test_unsupported_models_are_value_errors():
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    with pytest.raises(
        ValueError, match="model type 'llama' is not supported.*olmoe, qwen2_moe, qwen3_moe, mixtral, flex_olmo"
    ):
        pt.patch_model(llama, "probmoe")
    with pytest.raises(ValueError, match="model must be a transformers PreTrainedModel"):
        pt.patch_model(torch.nn.Linear(2, 2), "probmoe")
    with pytest.raises(ValueError, match="model is not patched"):
        pt.unpatch_model(tiny_model("olmoe"))
    with pytest.raises(ValueError, match="model is not patched"):
        pt.router_stats(tiny_model("olmoe"))


# ---------------------------------------------------------------------------------------------
# What a transformers release could move: the version gate, the forward signature, the layout


def test_version_gate_names_the_range_and_the_version():
    from probmoe.integrations.transformers import version

    for bad in ("5.22.0", "4.57.1", "6.0.0", "6.0.0.dev0", "7.1"):
        with pytest.raises(ImportError) as info:
            version.check(bad)
        assert f"found {bad}" in str(info.value) and "transformers>=5.23,<6" in str(info.value)
        assert "5.23.0 and 5.24.0" in str(info.value)
    with pytest.raises(ImportError, match="cannot read the transformers version 'five'"):
        version.check("five")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for good in version.TESTED + ("5.24.1", "5.23.0.dev0"):
            version.check(good)
    with pytest.warns(UserWarning, match="transformers 5.25.0 is newer than the releases .* tested with"):
        version.check("5.25.0")


def test_version_gate_matches_the_extra_and_runs_at_import():
    import tomllib

    from probmoe.integrations.transformers import version

    root = Path(__file__).resolve().parents[2]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["transformers"]
    assert f"transformers{version.REQUIRES}" in extra
    code = "import transformers; transformers.__version__ = '5.22.0'\nimport probmoe.integrations.transformers"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.returncode != 0
    assert "ImportError: probmoe.integrations.transformers needs transformers>=5.23,<6" in out.stderr
    assert "found 5.22.0" in out.stderr


@pytest.mark.parametrize("family", pt.ALL_FAMILIES)
def test_patched_forward_has_the_stock_signature(family):
    import inspect

    stock = tiny_model(family)
    model = pt.patch_model(tiny_model(family), "conventional")
    assert inspect.signature(model.forward) == inspect.signature(stock.forward)
    x = batch(5, (1, 6))
    with pytest.raises(TypeError):
        model(x, None, None, None, None, None, None, None, None, None, None)  # more than the stock positionals
    torch.testing.assert_close(model.eval()(x, None).logits, stock.eval()(x).logits, rtol=0, atol=0)


def test_a_forward_without_labels_is_a_layout_error():
    from transformers.models.olmoe.modeling_olmoe import OlmoeForCausalLM

    from probmoe.integrations.transformers import model as model_mod

    class Renamed(OlmoeForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, target_ids=None, **kwargs):
            return super().forward(input_ids, attention_mask, labels=target_ids, **kwargs)

    with pytest.raises(pt.LayoutError, match="olmoe: Renamed.forward.* has no parameter 'labels' in transformers 5"):
        model_mod.model_class(Renamed, True)


def _drop_gate(block):
    block.gate = torch.nn.Identity()


def _drop_hidden_dim(block):
    del block.gate.hidden_dim


def _drop_experts(block):
    del block.experts


@pytest.mark.parametrize(
    "damage,message",
    [
        (_drop_gate, "olmoe: OlmoeSparseMoeBlock 'model.layers.0.mlp'.gate is a Identity, not a OlmoeTopKRouter"),
        (_drop_hidden_dim, "olmoe: .*gate \\(OlmoeTopKRouter\\) has no attribute 'hidden_dim'"),
        (_drop_experts, "olmoe: OlmoeSparseMoeBlock 'model.layers.0.mlp' has no submodule 'experts'"),
    ],
)
def test_a_moved_attribute_is_a_layout_error_before_any_change(damage, message):
    model = tiny_model("olmoe")
    damage(model.model.layers[0].mlp)
    classes = [type(m) for m in model.modules()]
    with pytest.raises(pt.LayoutError, match=message) as info:
        pt.patch_model(model, "probmoe")
    assert "transformers 5." in str(info.value) and "tested with transformers 5.23.0 and 5.24.0" in str(info.value)
    assert not pt.is_patched(model) and [type(m) for m in model.modules()] == classes


def test_a_renamed_class_or_config_field_is_a_layout_error(monkeypatch):
    import dataclasses

    from transformers.models.olmoe import modeling_olmoe

    from probmoe.integrations.transformers import families

    renamed = dataclasses.replace(families.FAMILIES["olmoe"], experts_attr="num_routed_experts")
    monkeypatch.setitem(families.FAMILIES, "olmoe", renamed)  # as if a release renamed the config field
    with pytest.raises(pt.LayoutError, match="olmoe: the config \\(OlmoeConfig\\) has no field 'num_routed_experts'"):
        pt.patch_model(tiny_model("olmoe"), "probmoe")
    monkeypatch.undo()
    model = tiny_model("olmoe")
    monkeypatch.delattr(modeling_olmoe, "OlmoeSparseMoeBlock")
    with pytest.raises(pt.LayoutError, match="modeling_olmoe has no class 'OlmoeSparseMoeBlock'"):
        pt.patch_model(model, "probmoe")


@pytest.mark.parametrize("name,value", [("k", 2), ("kmin", 1), ("kmax", 2)])
def test_the_methods_an_error_names_as_taking_k_take_it(name, value):
    """The error for k / kmin / kmax given to a method that refuses it names the methods that take
    it: each named one accepts it, each other one refuses it (DeepSeek-V3 has every method but
    sparsemixer and remoe)."""
    import re

    from probmoe.integrations.transformers.families import FAMILIES
    from probmoe.integrations.transformers.methods import make_plan
    from probmoe.integrations.transformers.testing import tiny_config

    config = tiny_config("deepseek_v3")
    family = FAMILIES["deepseek_v3"]
    with pytest.raises(ValueError, match=f"^{name} applies only to the methods? ") as info:
        make_plan(config, family, "conventional", **{name: value})
    named = re.match(rf"{name} applies only to the methods? (.*?); method 'conventional'", str(info.value)).group(1)
    takers = set(named.split(", "))
    assert takers, str(info.value)
    for method in set(pt.ALL_METHODS) - {"sparsemixer", "remoe"}:
        if method in takers:
            make_plan(config, family, method, **{name: value})
        else:
            with pytest.raises(ValueError, match=name):
                make_plan(config, family, method, **{name: value})
    assert {"sparsemixer", "remoe"}.isdisjoint(takers)
