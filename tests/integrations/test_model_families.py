"""probmoe.integrations.model_families: the one home of the families' facts (issue 47, point 5).

Every reader (the transformers integration, its tiny models, the vLLM plugin's settings and
architectures, ``probmoe-train --model tiny-*``, the serving checkpoints' maker) derives what it
knows of a family from the table, and the table imports no framework; FlexOlmo, one row, trains,
saves, reloads and evaluates like the others.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from probmoe.integrations import model_families as mf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_table_imports_no_framework():
    """Loaded from its file alone, the table imports neither torch, transformers nor vllm."""
    path = os.path.join(ROOT, "probmoe", "integrations", "model_families.py")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('model_families', {path!r})\n"
        "m = sys.modules['model_families'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "print(len(m.TABLE), sorted(x for x in ('torch', 'transformers', 'vllm', 'numpy') if x in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(len(mf.TABLE)), "[]"]


def test_groups_of_the_table():
    assert mf.ALL == mf.SUPPORTED + mf.GROUPED and set(mf.ALL) == set(mf.TABLE)
    assert all(mf.TABLE[t].grouped for t in mf.GROUPED) and not any(mf.TABLE[t].grouped for t in mf.SUPPORTED)
    assert set(mf.SERVED) == {t for t, f in mf.TABLE.items() if f.vllm_module is not None}
    assert "flex_olmo" in mf.SUPPORTED and "flex_olmo" not in mf.SERVED
    assert mf.TABLE["mixtral"].architecture == "MixtralForCausalLM"
    assert mf.TABLE["qwen2_moe"].tiny_name == "tiny-qwen2-moe"


def test_every_reader_derives_from_the_table():
    from probmoe.experiments.models import TINY
    from probmoe.integrations import vllm as pv
    from probmoe.integrations.transformers import families, testing
    from probmoe.integrations.vllm import settings

    for name, facts in mf.TABLE.items():
        family = families.FAMILIES[name]
        assert {f.name: getattr(family, f.name) for f in dataclasses.fields(mf.FamilyFacts)} == {
            f.name: getattr(facts, f.name) for f in dataclasses.fields(mf.FamilyFacts)
        }
        assert testing.EXTRA[name] == dict(facts.tiny)
        assert TINY[facts.tiny_name] == name
    assert families.ALL == mf.ALL and families.SUPPORTED == mf.SUPPORTED and families.GROUPED == mf.GROUPED
    assert settings.FAMILIES == mf.SERVED
    assert tuple(mf.TABLE[t].architecture for t in mf.SERVED) == pv.ARCHITECTURES


def test_served_architectures_exist_in_vllm():
    """Each served row names a module of vLLM holding its architecture (where vLLM is installed)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed here (tools/serving/venv.sh runs the serving tests)")
    for t in mf.SERVED:
        module = importlib.import_module(f"vllm.model_executor.models.{mf.TABLE[t].vllm_module}")
        assert hasattr(module, mf.TABLE[t].architecture), t


def test_the_tiny_configs_have_the_rows_fields():
    from probmoe.integrations.transformers.testing import tiny_config

    for name, facts in mf.TABLE.items():
        config = tiny_config(name)
        assert config.model_type == name
        for key, value in dict(facts.tiny).items():
            assert getattr(config, key) == value, (name, key)
        assert getattr(config, facts.experts_attr) == 8


@pytest.mark.parametrize("method", ["probmoe", "probmoe-dynamic", "remoe"])
def test_flex_olmo_trains_saves_reloads_and_evaluates(tmp_path, method):
    """The row added for FlexOlmo is all it took: patch, train a step, save, reload, and eval
    agrees with stock top-k where the method's eval rule is top-k."""
    import probmoe.integrations.transformers as pt
    from probmoe.integrations.transformers.testing import tiny_model

    stock = tiny_model("flex_olmo", seed=1).eval()
    model = pt.patch_model(tiny_model("flex_olmo", seed=1), method)
    ids = torch.randint(3, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(p.grad is not None for n, p in model.named_parameters() if n.endswith("mlp.gate.weight"))
    model.eval()
    model.save_pretrained(tmp_path / "ckpt")
    again = pt.from_pretrained(tmp_path / "ckpt").eval()
    assert again.probmoe_plan.method == method
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, again(input_ids=ids).logits
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        if method == "probmoe":  # Exact-k's MAP is the stock top-k
            torch.testing.assert_close(a, stock(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
