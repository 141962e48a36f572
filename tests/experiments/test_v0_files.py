"""Files written before the options were declared once still load (tests/fixtures/v0, written by
commit 79e4461): a run's config.yaml, its resumable checkpoint (fingerprint, settings file, state)
and the settings files saved beside checkpoints, for the transformers integration and the vLLM
plugin's reader alike."""

import dataclasses
import json
import os
import shutil

import pytest

pytest.importorskip("transformers")

from probmoe.cli import train
from probmoe.experiments import config_parser, state
from probmoe.experiments.run_config import TrainConfig

V0 = os.path.join(os.path.dirname(__file__), "..", "fixtures", "v0")
SETTINGS = sorted(os.listdir(os.path.join(V0, "settings")))


@pytest.fixture
def v0(tmp_path, monkeypatch):
    """A copy of tests/fixtures/v0 as the working folder (its files name each other relatively)."""
    shutil.copytree(V0, tmp_path / "v0")
    monkeypatch.chdir(tmp_path / "v0")
    return tmp_path / "v0"


def _plan(model) -> dict:
    """The plan as the v0 code wrote it (its options were flat fields, 0 or "" where one did not apply)."""
    plan = model.probmoe_plan
    out = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != "options"}
    routing = plan.routing.to_dict() if plan.routing else None  # in v0's words: method, backend (issue 47)
    out["routing"] = routing and {
        {"estimator": "method", "algorithm": "backend"}.get(k, k): v for k, v in routing.items()
    }
    o = plan.options
    out.update(method=o.method, aux_loss=o.aux_loss, z_loss=o.z_loss, balance=o.balance)
    for name in ("l1_coef", "l1_rate", "balance_rate", "jitter_eps"):
        out[name] = getattr(o, name) or 0.0
    out["l1_layers"] = o.l1_layers or ""
    return out


def test_v0_config_yaml_reads_into_the_same_options(v0):
    cfg = config_parser.parse(TrainConfig, train.parser(), ["--config", "run/config.yaml"])
    flat = config_parser.as_file(cfg)
    import yaml

    from probmoe.integrations.routing_options import OLD_NAMES

    with open("run/config.yaml", encoding="utf-8") as f:  # v0 wrote the old names ("backend")
        assert flat == {OLD_NAMES.get(key, key): value for key, value in yaml.safe_load(f).items()}


def test_v0_fingerprint_matches_and_the_run_resumes_to_the_same_loss(v0, capsys):
    from probmoe.experiments import trainer

    cfg = config_parser.parse(TrainConfig, train.parser(), ["--config", "run/config.yaml"])
    manifest = state.read_manifest("run/checkpoint-000001")
    world = type("World", (), {"size": 1, "device": __import__("torch").device("cpu")})()
    assert trainer.fingerprint(cfg, world, 2, "question-answer") == state.saved_fingerprint(manifest)
    assert train.main(["--config", "run/config.yaml", "--resume", "latest"]) == 0
    assert "resumed from run/checkpoint-000001 at step 1 of 2" in capsys.readouterr().err
    with open(os.path.join(V0, "run", "train_log.jsonl"), encoding="utf-8") as f:
        before = [json.loads(line) for line in f][-1]
    with open("run/train_log.jsonl", encoding="utf-8") as f:
        after = [json.loads(line) for line in f if '"step": 2,' in line][-1]
    assert after["step"] == before["step"]
    # The v0 run logged its step 2 on another machine, and torch's float32 CPU results can differ there
    # in the last bits (the order its kernels sum in is theirs to pick): the same weights, batch and
    # routing draws gave 5.538692728678385 on a 2-core AVX2 EPYC against 5.538692220052083 logged, 9e-8
    # apart, with every commit since the files were written. On one machine a resume repeats the run
    # bit for bit (test_interrupts.py). Another routing draw moves the loss by 1e-5, the gradient norm
    # by 1e-4 and the router loss by 4%.
    for key in ("loss", "router_loss", "grad_norm"):
        assert after[key] == pytest.approx(before[key], rel=1e-6, abs=0), key


@pytest.mark.parametrize("name", SETTINGS)
def test_v0_settings_files_load_with_the_same_plan(name):
    import probmoe.integrations.transformers as pt

    directory = os.path.join(V0, "settings", name)
    with open(os.path.join(directory, "made_with.json"), encoding="utf-8") as f:
        made = json.load(f)
    model = pt.from_pretrained(directory)
    assert _plan(model) == made["plan"]


def test_v0_run_checkpoint_loads_with_the_same_plan():
    import probmoe.integrations.transformers as pt

    with open(os.path.join(V0, "run", "plan.json"), encoding="utf-8") as f:
        assert _plan(pt.from_pretrained(os.path.join(V0, "run", "checkpoint-000001"))) == json.load(f)


@pytest.mark.parametrize("name", SETTINGS)
def test_v0_settings_files_read_for_serving(name):
    from transformers import AutoConfig

    from probmoe.integrations.vllm import settings

    directory = os.path.join(V0, "settings", name)
    config = AutoConfig.from_pretrained(directory)
    data = settings.read(directory)
    assert data["method"] == json.load(open(os.path.join(directory, "made_with.json")))["method"]
    if name == "probmoe-grouped":  # DeepSeek-V3's grouped rule is refused by the plugin, as it was
        with pytest.raises(settings.ServingSettingsError, match="is not served"):
            settings.serving_rule(directory, config)
    else:
        assert settings.serving_rule(directory, config).method == data["method"]
