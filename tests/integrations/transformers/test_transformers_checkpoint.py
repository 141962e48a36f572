"""Checkpoints of patched models stay stock; the routing travels in probmoe_routing.json."""

import json
import os

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

from transformers import AutoModelForCausalLM

import probmoe
import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.testing import tiny_model


def batch(seed=0):
    return torch.randint(3, 256, (2, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", pt.SUPPORTED)
def test_save_loads_in_stock_transformers_and_restores_routing(family, tmp_path):
    model = pt.patch_model(tiny_model(family), "probmoe", aux_loss=0.02, z_loss=0.001)
    model.save_pretrained(tmp_path)
    assert os.path.isfile(tmp_path / pt.SETTINGS_FILENAME)

    stock, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert not pt.is_patched(stock)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [type(stock).__name__]
    assert set(stock.state_dict()) == set(model.state_dict())
    x = batch()
    with torch.no_grad():  # exactly-k ProbMoE at eval == the stock model it was saved as
        torch.testing.assert_close(model.eval()(x).logits, stock.eval()(x).logits, atol=1e-5, rtol=0)

    reloaded = pt.from_pretrained(tmp_path)
    assert pt.is_patched(reloaded)
    assert reloaded.probmoe_plan == model.probmoe_plan
    assert reloaded.probmoe_plan.options.aux_loss == 0.02 and reloaded.probmoe_plan.options.z_loss == 0.001
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(x).logits, model(x).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "method,kwargs",
    [
        ("probmoe-dynamic", dict(kmin=1, kmax=3)),
        ("densemixer", {}),
        ("frozen", {}),
        ("topk-marginal", dict(k=3, grad="paper", algorithm="dp")),
        ("defaultmoe", {}),
        ("sparsemixer", {}),
        ("remoe", dict(l1_coef=1e-3, l1_rate=1.5)),
    ],
)
def test_every_method_round_trips(method, kwargs, tmp_path):
    model = pt.patch_model(tiny_model("qwen2_moe"), method, **kwargs)
    model.save_pretrained(tmp_path)
    reloaded = pt.from_pretrained(tmp_path)
    assert reloaded.probmoe_plan == model.probmoe_plan
    if method == "frozen":
        assert not any(b.gate.weight.requires_grad for b in reloaded.probmoe_family.blocks(reloaded))
    if method == "probmoe-dynamic":
        assert isinstance(reloaded.probmoe_plan.routing, probmoe.RoutingConfig)
        assert (reloaded.probmoe_plan.routing.kmin, reloaded.probmoe_plan.routing.kmax) == (1, 3)


def saved(tmp_path, family="olmoe"):
    pt.patch_model(tiny_model(family), "probmoe").save_pretrained(tmp_path)
    return tmp_path / pt.SETTINGS_FILENAME


def test_missing_settings_file(tmp_path):
    tiny_model("olmoe").save_pretrained(tmp_path)  # a stock save writes no settings
    with pytest.raises(FileNotFoundError, match="probmoe_routing.json is missing"):
        pt.from_pretrained(tmp_path)


def test_unreadable_settings_file(tmp_path):
    saved(tmp_path).write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        pt.from_pretrained(tmp_path)
    (tmp_path / pt.SETTINGS_FILENAME).write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        pt.from_pretrained(tmp_path)


@pytest.mark.parametrize("field,value", [("method", "conventional"), ("aux_loss", 1.0), ("num_experts", 4)])
def test_tampered_settings_file(tmp_path, field, value):
    path = saved(tmp_path)
    data = json.loads(path.read_text())
    (data if field in data else data["options"])[field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="modified after it was written"):
        pt.from_pretrained(tmp_path)


def test_settings_with_valid_checksum_but_bad_content(tmp_path):
    from probmoe.integrations.transformers import settings

    path = saved(tmp_path)
    for change, message in [
        (dict(routing={"num_experts": 8, "k": 9}), "bad routing config"),
        (dict(method="nope"), "method must be one of"),
        (dict(model_type="mixtral"), "is for model type 'mixtral'"),
        (dict(top_k=3), "records 8 experts, top-3"),
        (dict(version=5), "is not 'probmoe-transformers-routing' version 1, 2, 3, 4"),
        (dict(options={"nope": 1}), "options must be an object with keys among"),
    ]:
        data = settings.content(pt.patch_model(tiny_model("olmoe"), "probmoe").probmoe_plan, "olmoe")
        data.update(change)
        data["sha256"] = settings.digest(data)  # a consistent file with bad content
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=message):
            pt.from_pretrained(tmp_path)
    data = settings.content(pt.patch_model(tiny_model("olmoe"), "probmoe").probmoe_plan, "olmoe")
    data["extra"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="must have exactly the fields"):
        pt.from_pretrained(tmp_path)


def test_from_pretrained_needs_a_directory(tmp_path):
    with pytest.raises(ValueError, match="path must be a local checkpoint directory"):
        pt.from_pretrained(tmp_path / "nowhere")


def test_settings_file_content_and_loader_kwargs(tmp_path):
    model = pt.patch_model(tiny_model("mixtral"), "probmoe-dynamic", kmin=1, kmax=2, algorithm="dp")
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / pt.SETTINGS_FILENAME).read_text())
    assert data["format"] == "probmoe-transformers-routing" and data["version"] == 4
    assert {**data["options"], "method": data["method"]} == model.probmoe_plan.options.to_dict()
    assert (data["model_type"], data["num_experts"], data["top_k"], data["method"]) == (
        "mixtral",
        8,
        2,
        "probmoe-dynamic",
    )
    assert probmoe.RoutingConfig.from_dict(data["routing"]) == model.probmoe_plan.routing
    assert data["routing"]["normalize"] is True  # Mixtral renormalises
    reloaded = pt.from_pretrained(tmp_path, experts_implementation="eager", generator=torch.Generator())
    assert reloaded.config._experts_implementation == "eager"
    assert reloaded.probmoe_plan == model.probmoe_plan
    x = batch()
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(x).logits, model.eval()(x).logits, atol=1e-5, rtol=0)


def test_version_1_settings_file_still_loads(tmp_path):
    """A file written before "options" existed (version 1: method, aux_loss, z_loss beside routing)."""
    from probmoe.integrations.transformers import settings

    path = saved(tmp_path)
    data = json.loads(path.read_text())
    options = data.pop("options")
    data.update(version=1, aux_loss=options["aux_loss"], z_loss=options["z_loss"])
    data["sha256"] = settings.digest(data)
    path.write_text(json.dumps(data))
    assert pt.from_pretrained(tmp_path).probmoe_plan.method == "probmoe"


@pytest.mark.parametrize("method", ["remoe", "defaultmoe"])
def test_routing_state_round_trips(method, tmp_path):
    """ReMoE's λ and DefaultMoE's default outputs, changed by training, come back with the model;
    a missing or damaged state file is a ValueError naming it."""
    from probmoe.integrations.transformers.controls import after_step

    model = pt.patch_model(tiny_model("olmoe"), method).train()
    x = batch()
    model(x, labels=x).loss.backward()
    after_step(model)
    model.save_pretrained(tmp_path)
    reloaded = pt.from_pretrained(tmp_path)
    name = "probmoe_remoe" if method == "remoe" else "probmoe_defaults"
    want = [m._buffers[name] for m in model.modules() if name in m._buffers]
    got = [m._buffers[name] for m in reloaded.modules() if name in m._buffers]
    assert len(got) == len(want) == 2 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert want[0].abs().sum() > 0 and (method != "remoe" or float(want[0][0]) != 1e-8)
    from safetensors.torch import load_file

    from probmoe.integrations.transformers import runtime_state

    tiny_model("olmoe").save_pretrained(tmp_path / "stock")
    stock = set(load_file(tmp_path / "stock" / "model.safetensors"))
    assert set(load_file(tmp_path / "model.safetensors")) == stock  # checkpoint keys stay stock
    assert set(reloaded.state_dict()) - set(tiny_model("olmoe").state_dict()) == set(
        runtime_state.state_buffers(reloaded)
    )  # the state dict carries the routing state
    state = tmp_path / "probmoe_state.safetensors"
    state.write_bytes(state.read_bytes()[:40])
    with pytest.raises(ValueError, match="probmoe_state.safetensors"):
        pt.from_pretrained(tmp_path)
    state.unlink()
    with pytest.raises(ValueError, match="probmoe_state.safetensors is missing"):
        pt.from_pretrained(tmp_path)
