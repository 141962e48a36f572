"""vLLM without the plugin (issue 49 point 2): every checkpoint whose rule stock vLLM cannot run is
refused, with a message naming its ``ProbMoE...`` architecture; a stock-named one serves the
transformers model's tokens. With the plugin, an old stock-named checkpoint of a non-stock rule still
serves its rule, and a ``ProbMoE...`` checkpoint without its settings file is refused.

Runs where vllm is importable, on the fixtures ``bash tools/serving/venv.sh`` makes
(``PROBMOE_SERVING_FIXTURES``); the engine runs without the plugin in a child process whose
``VLLM_PLUGINS`` allow-list leaves it out, as in test_vllm_serving.py.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
from .test_vllm_serving import _STOCK_RUN, DYNAMIC, NAMES, ckpt, close, expected, greedy, llm_of


def _architecture(name: str) -> str:
    with open(os.path.join(ckpt(name), "config.json")) as f:
        return json.load(f)["architectures"][0]


def _without_plugin(path: str, exp: dict):
    env = dict(os.environ, VLLM_PLUGINS="lora_filesystem_resolver", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    args = [sys.executable, "-c", _STOCK_RUN, path, json.dumps(exp["prompts"]), str(len(exp["tokens"][0]))]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", NAMES)
def test_stock_vllm_serves_or_refuses(name):
    exp, arch = expected(name), _architecture(name)
    out = _without_plugin(ckpt(name), exp)
    if arch.startswith("ProbMoE"):
        assert out.returncode != 0
        assert f"Model architectures ['{arch}'] are not supported" in out.stderr, out.stderr[-3000:]
    else:
        assert out.returncode == 0, out.stderr[-3000:]
        tokens = next(line[7:] for line in out.stdout.splitlines() if line.startswith("TOKENS "))
        assert json.loads(tokens) == exp["tokens"]


def _copy(tmp_path, name):
    path = str(tmp_path / name)
    shutil.copytree(ckpt(name), path)
    return path


def test_plugin_serves_an_old_stock_named_checkpoint(tmp_path):
    if DYNAMIC not in NAMES:
        pytest.skip(f"{DYNAMIC} not among the fixtures")
    path = _copy(tmp_path, DYNAMIC)
    config = os.path.join(path, "config.json")
    data = json.load(open(config))
    assert data["architectures"] == ["ProbMoEOlmoeForCausalLM"]
    data["architectures"] = ["OlmoeForCausalLM"]  # as saved before the probmoe names
    json.dump(data, open(config, "w"))
    exp = expected(DYNAMIC)
    llm = llm_of(path)
    try:
        assert llm.apply_model(lambda m: m.probmoe_rule.kind)[0] == "range"
        assert greedy(llm, exp["prompts"], len(exp["tokens"][0])) == exp["tokens"]
    finally:
        close(llm)


def test_plugin_refuses_a_probmoe_name_without_settings(tmp_path):
    if DYNAMIC not in NAMES:
        pytest.skip(f"{DYNAMIC} not among the fixtures")
    path = _copy(tmp_path, DYNAMIC)
    os.remove(os.path.join(path, "probmoe_routing.json"))
    with pytest.raises(Exception) as e:
        llm_of(path)
    text = "".join(str(x) for x in (e.value, e.value.__cause__, e.value.__context__))
    assert "'ProbMoEOlmoeForCausalLM'" in text and "probmoe_routing.json (the rule) is missing" in text, text
    gc.collect()
