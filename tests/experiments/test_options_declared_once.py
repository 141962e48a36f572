"""A routing option is declared once (``RoutingOptions``): a new field, and nothing else, is a flag
of probmoe-train with its help, type and check, a key of config files and of the config.yaml a run
writes, a field of the resume fingerprint, a keyword of make_plan / patch_model (read by the code
that uses it as ``plan.options.<name>``) and an entry of the settings file saved beside a
checkpoint. Here the field is added in a subclass, as a new option would be added to the class."""

import dataclasses
import json

import pytest

pytest.importorskip("transformers")

from probmoe._validate import Number
from probmoe.experiments import config_parser, state, trainer
from probmoe.experiments.run_config import TrainConfig, section
from probmoe.integrations.routing_options import RoutingOptions, option


@dataclasses.dataclass(frozen=True)
class WithTemperature(RoutingOptions):
    temperature: float | None = option(
        None, "router temperature (default 1)", type=Number(float, 0, inclusive=False), training=True
    )


@dataclasses.dataclass
class TrainWithTemperature(TrainConfig):
    routing: WithTemperature = section(WithTemperature, resume=True)


def _parser():
    return config_parser.parser(TrainWithTemperature, "probmoe-train", "test")


def test_a_new_field_is_a_flag_a_config_key_and_a_fingerprint_field(tmp_path, capsys):
    p = _parser()
    (action,) = [a for a in p._actions if a.dest == "temperature"]
    assert action.option_strings == ["--temperature"] and action.help == "router temperature (default 1)"
    cfg = config_parser.parse(
        TrainWithTemperature, p, ["--model", "m", "--temperature", "0.5", "--method", "probmoe-dynamic", "--kmin", "2"]
    )
    assert (cfg.routing.temperature, cfg.routing.kmin) == (0.5, 2) and isinstance(cfg.routing, WithTemperature)
    with pytest.raises(SystemExit):
        config_parser.parse(TrainWithTemperature, _parser(), ["--model", "m", "--temperature", "0"])
    assert "argument --temperature: must be a number > 0 (finite), got 0" in capsys.readouterr().err
    path = tmp_path / "config.yaml"
    config_parser.write(cfg, str(path))  # the run folder's config.yaml
    assert "temperature: 0.5" in path.read_text()
    assert config_parser.parse(TrainWithTemperature, _parser(), ["--config", str(path)]) == cfg
    (tmp_path / "run.toml").write_text('model = "m"\ntemperature = 2.0\n')
    assert config_parser.parse(TrainWithTemperature, _parser(), ["--config", str(tmp_path / "run.toml")]).routing == (
        WithTemperature(temperature=2.0)
    )
    keys = config_parser.resume_keys(TrainWithTemperature)
    assert set(keys) == set(config_parser.resume_keys(TrainConfig)) | {"temperature"}
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    cfg.data.path = str(data)
    world = type("World", (), {"size": 1, "device": __import__("torch").device("cpu")})()
    fingerprint = trainer.fingerprint(cfg, world, 10, "question-answer")
    assert fingerprint["temperature"] == 0.5
    with pytest.raises(ValueError, match=r"--temperature: checkpoint None, now 0.5"):
        state.check_resume({"fingerprint": {**fingerprint, "temperature": None}}, fingerprint, "ckpt")


def test_a_new_field_is_checked_once_in_the_dataclass():
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got -1.0"):
        WithTemperature(temperature=-1.0)


def test_a_new_field_reaches_the_plan_and_the_settings_file(tmp_path):
    import probmoe.integrations.transformers as pt
    from probmoe.integrations.transformers.testing import tiny_model

    model = pt.patch_model(tiny_model("olmoe"), options=WithTemperature(method="probmoe-dynamic", temperature=0.5))
    assert model.probmoe_plan.options.temperature == 0.5  # what the code that uses it reads
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / pt.SETTINGS_FILENAME).read_text())
    options = data["options"]
    assert options["temperature"] == 0.5 and options["kmax"] == 2  # resolved: the model's top-k
    assert WithTemperature.from_dict({**options, "method": data["method"]}) == model.probmoe_plan.options


def test_patch_model_keywords_are_the_fields():
    import probmoe.integrations.transformers as pt
    from probmoe.integrations.transformers.testing import tiny_model

    names = [f.name for f in dataclasses.fields(RoutingOptions)]
    with pytest.raises(ValueError, match=r"unknown routing options \['temperature'\]; the options are") as e:
        pt.patch_model(tiny_model("olmoe"), "probmoe", temperature=0.5)
    assert str(names) in str(e.value)
