"""The routing options' one word per concept (issue 47, point 2): ``algorithm`` (circuit or dp) is
the option, the flag and the settings files' key; ``backend``, its old name, still works as a
keyword (with a DeprecationWarning), as a flag and as a config-file key, and old settings files that
wrote it load."""

from __future__ import annotations

import json
import os

import pytest

from probmoe.experiments import config_parser
from probmoe.experiments.run_config import TrainConfig
from probmoe.integrations import settings_file
from probmoe.integrations.routing_options import RoutingOptions

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "v0", "settings")


def test_the_option_is_algorithm_and_backend_is_its_old_name():
    assert RoutingOptions(algorithm="dp").algorithm == "dp"
    with pytest.warns(DeprecationWarning, match="backend= is deprecated, use algorithm="):
        old = RoutingOptions.given(method="probmoe", backend="dp")
    assert old == RoutingOptions(method="probmoe", algorithm="dp")
    with pytest.warns(DeprecationWarning, match="RoutingOptions.backend is deprecated"):
        assert old.backend == "dp"
    with pytest.raises(ValueError, match="give algorithm= only"):
        RoutingOptions.given(method="probmoe", backend="dp", algorithm="circuit")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        RoutingOptions(algorithm="gpu")


def test_files_read_the_old_key_silently():
    assert RoutingOptions.from_dict({"method": "probmoe", "backend": "dp"}).algorithm == "dp"
    with pytest.raises(ValueError, match="'backend' is the old name of 'algorithm'"):
        RoutingOptions.from_dict({"method": "probmoe", "backend": "dp", "algorithm": "dp"})
    assert "algorithm" in RoutingOptions().to_dict() and "backend" not in RoutingOptions().to_dict()


def test_flags_and_config_files_take_both_words(tmp_path):
    p = config_parser.parser(TrainConfig, "probmoe-train", "")
    new = config_parser.parse(TrainConfig, p, ["--model", "tiny-olmoe", "--data", "x", "--algorithm", "dp"])
    old = config_parser.parse(TrainConfig, p, ["--model", "tiny-olmoe", "--data", "x", "--backend", "dp"])
    assert new.routing.algorithm == old.routing.algorithm == "dp"
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny-olmoe\ndata: x\nbackend: dp\n")
    assert config_parser.parse(TrainConfig, p, ["--config", str(path)]).routing.algorithm == "dp"


def test_settings_files_are_version_4_and_old_ones_load(tmp_path):
    data = settings_file.content(
        RoutingOptions(method="conventional"), None, model_type="olmoe", num_experts=8, top_k=2
    )
    assert data["version"] == 4 and "algorithm" in data["options"] and "backend" not in data["options"]
    for name in sorted(os.listdir(FIXTURES)):  # the v0 checkpoints' files: version 3, the old words
        path = os.path.join(FIXTURES, name)
        with open(os.path.join(path, settings_file.FILENAME)) as f:
            written = json.load(f)
        read = settings_file.read(path)
        assert read["options"].method == written["method"]
        if written["routing"] is not None:
            assert read["options"].algorithm == read["routing"].algorithm
