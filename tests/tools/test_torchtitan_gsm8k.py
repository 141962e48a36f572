"""tools/torchtitan_gsm8k.py under torchrun, 2 ranks on gloo: a few steps of the tiny torchtitan MoE model
on GSM8K rows with ProbMoE Dynamic-k routing and EP = 2; the loss falls, the routing statistics are
logged, and the run resumed from its checkpoint repeats the losses and parameters bit for bit."""

import json
import os
import subprocess

import pytest

pytest.importorskip("triton")  # torchtitan imports it, also on CPU
pytest.importorskip("probmoe.integrations.torchtitan", exc_type=ImportError)

from gsm8k_data import write
from rank_runs import torchrun

TOOL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools", "torchtitan_gsm8k.py"
)


@pytest.mark.slow
def test_trains_logs_and_resumes_bit_for_bit(tmp_path):
    data = write(tmp_path, "train.jsonl", 64)
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [
            *torchrun(),
            "--standalone",
            "--nproc_per_node",
            "2",
            TOOL,
            "--data",
            data,
            "--out",
            str(out),
            "--steps",
            "12",
            "--save-at",
            "5",
            "--log-every",
            "1",
            "--seq-len",
            "64",
            "--batch-size",
            "4",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in open(out / "train_log.jsonl")]
    steps = [r for r in records if "step" in r]
    assert [r["step"] for r in steps] == list(range(1, 13))
    assert steps[-1]["loss"] < steps[0]["loss"]
    for layer in steps[-1]["layers"]:
        assert 1 <= layer["experts_per_token"] <= 4 and layer["load_cv"] >= 0 and layer["max_vio"] >= 0
    check = records[-1]["resume_check"]
    assert check == {"losses_equal": True, "params_equal": True, "resumed_from": 5, "steps": 12}
    assert (out / "checkpoint-5-rank0.pt").is_file() and (out / "checkpoint-5-rank1.pt").is_file()
