"""config.json's architectures (issue 49 point 2): stock iff a stock engine serves the checkpoint's rule.

A checkpoint whose rule stock vLLM cannot run is named ``ProbMoE<stock name>``, which stock vLLM
refuses (tests/serving/test_vllm_stock_refuses.py) and the plugin registers; transformers still
loads it by ``model_type``. The decision is the plugin's own: a checkpoint is stock-named exactly
when the plugin would build vLLM's stock model for it.
"""

import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from probmoe.integrations import architectures, model_families
from probmoe.integrations import vllm as pv
from probmoe.integrations.vllm import settings
from probmoe.methods import get_method, methods

pt = pytest.importorskip("probmoe.integrations.transformers")
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402


def _cases(family):
    grouped = model_families.TABLE[family].grouped
    for method in methods():
        rules = get_method(method)
        if rules.groups == ("never" if grouped else "only"):
            continue
        yield method, {}
        if rules.sizes == "exact-k":
            yield method, {"k": 2 if grouped else 3}
        if rules.balances:
            yield method, {"balance": "aux-free"}


CASES = [(f, m, kw) for f in ("olmoe", "mixtral", "deepseek_v3", "flex_olmo") for m, kw in _cases(f)]
STOCK = {  # the stock-named ones, spelled out
    *((f, m, "") for f in ("olmoe", "mixtral", "flex_olmo") for m in ("conventional", "frozen", "densemixer")),
    *((f, m, "") for f in ("olmoe", "mixtral", "flex_olmo") for m in ("probmoe", "sample-dense-ste")),
    *((f, m, "") for f in ("olmoe", "mixtral", "flex_olmo") for m in ("topk-marginal", "defaultmoe")),
    *(("deepseek_v3", m, b) for m in ("conventional", "frozen", "densemixer", "defaultmoe") for b in ("", "aux-free")),
}


def _saved(tmp_path, family, method, kw):
    model = pt.patch_model(tiny_model(family), method, **kw)
    path = tmp_path / f"{family}-{method}-{'-'.join(map(str, kw.values()))}"
    model.save_pretrained(path)
    return path, model


@pytest.mark.parametrize(
    "family,method,kw", CASES, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values()))
)
def test_architectures_stock_iff_the_rule_is_stock_served(tmp_path, family, method, kw):
    path, model = _saved(tmp_path, family, method, kw)
    names = json.loads((path / "config.json").read_text())["architectures"]
    stock = model_families.TABLE[family].architecture
    expected_stock = (family, method, kw.get("balance", "")) in STOCK and "k" not in kw
    assert names == [stock if expected_stock else "ProbMoE" + stock]
    if family in settings.FAMILIES:  # the plugin builds vLLM's stock model exactly for the stock-named
        if get_method(method).groups == "only":
            with pytest.raises(settings.ServingSettingsError):
                settings.serving_rule(str(path), model.config)
            return
        rule = settings.serving_rule(str(path), model.config)
        assert (rule.stock and rule.slots == model.config.num_experts_per_tok) == expected_stock
        assert names[0] in pv.ARCHITECTURES + pv.PROBMOE_ARCHITECTURES


def test_probmoe_named_checkpoint_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    path, model = _saved(tmp_path, "olmoe", "probmoe-dynamic", {"kmin": 1, "kmax": 4})
    assert json.loads((path / "config.json").read_text())["architectures"] == ["ProbMoEOlmoeForCausalLM"]
    stock = AutoModelForCausalLM.from_pretrained(path)
    assert type(stock).__name__ == "OlmoeForCausalLM"
    loaded = pt.from_pretrained(path).eval()
    x = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    assert torch.equal(loaded(x).logits, model.eval()(x).logits)
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["architectures"] == ["ProbMoEOlmoeForCausalLM"]


def test_plugin_registers_every_probmoe_name(monkeypatch):
    """Without vLLM: ``register`` hands vLLM's registry the stock and the probmoe name of every served
    family, each to its class in ``probmoe.integrations.vllm.models``."""
    registered = {}
    fake = types.ModuleType("vllm")
    fake.ModelRegistry = types.SimpleNamespace(register_model=lambda name, target: registered.update({name: target}))
    monkeypatch.setitem(sys.modules, "vllm", fake)
    pv.register()
    served = model_families.SERVED
    assert tuple("ProbMoE" + model_families.TABLE[t].architecture for t in served) == pv.PROBMOE_ARCHITECTURES
    assert set(registered) == {
        n
        for t in served
        for n in (model_families.TABLE[t].architecture, "ProbMoE" + model_families.TABLE[t].architecture)
    }
    assert all(target == f"probmoe.integrations.vllm.models:{name}" for name, target in registered.items())
    assert architectures.SERVED_NAMES == pv.PROBMOE_ARCHITECTURES


@pytest.mark.parametrize(
    "method,expected", [("probmoe-dynamic", "ProbMoEOlmoeForCausalLM"), ("probmoe", "OlmoeForCausalLM")]
)
def test_fsdp_final_config_is_named_alike(tmp_path, method, expected):
    """The FSDP run's final config.json (``experiments.fsdp.save_config``, which rewrites what
    save_pretrained wrote under FSDP's wrapper class) takes the same name."""
    from probmoe.experiments import fsdp

    fsdp.save_config(str(tmp_path), pt.patch_model(tiny_model("olmoe"), method))
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [expected]


def test_push_to_hub_uploads_the_renamed_architecture_and_our_files(tmp_path, monkeypatch):
    """save_pretrained(push_to_hub=True) uploads the folder inside transformers' save_pretrained: the
    probmoe name, the settings file and the routing state must be there by then (they were written
    after the upload). The hub is replaced by recorders; nothing leaves the machine."""
    import transformers.modeling_utils as modeling_utils

    uploaded = {}

    def upload(self, working_dir, repo_id, files_timestamps, **kwargs):  # what would go up, read at that moment
        for name in sorted(os.listdir(working_dir)):
            uploaded[name] = (Path(working_dir) / name).read_bytes()

    monkeypatch.setattr(
        modeling_utils,
        "hf_api",
        lambda: types.SimpleNamespace(create_repo=lambda repo_id, **_: types.SimpleNamespace(repo_id=repo_id)),
    )
    monkeypatch.setattr(
        modeling_utils, "create_and_tag_model_card", lambda *a, **k: types.SimpleNamespace(save=lambda path: None)
    )
    monkeypatch.setattr(modeling_utils.PreTrainedModel, "_upload_modified_files", upload)
    model = pt.patch_model(tiny_model("olmoe"), "remoe")  # ReMoE: a probmoe name and routing state
    model.save_pretrained(tmp_path / "pushed", push_to_hub=True, repo_id="someone/tiny-remoe")
    assert json.loads(uploaded["config.json"])["architectures"] == ["ProbMoEOlmoeForCausalLM"]
    assert {"probmoe_routing.json", "probmoe_state.safetensors"} <= set(uploaded)
    assert uploaded["probmoe_routing.json"] == (tmp_path / "pushed" / "probmoe_routing.json").read_bytes()
    assert "_upload_modified_files" not in vars(model)  # the model is left as it was
