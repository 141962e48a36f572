"""tools/bench_step.py on the CPU at tiny sizes: the grouped family (DeepSeek-V3's gate) beside its
stock gate, peak memory from fresh processes, and a grouped method refused without groups."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = str(ROOT / "tools" / "bench_step.py")
TINY = ["--devices", "cpu", "--hidden", "64", "--heads", "2", "--vocab", "256", "--layers", "1"]
TINY += ["--tokens", "128", "--seq", "64", "--repeats", "1", "--threads", "1"]


def test_the_grouped_step_beside_the_stock_gate_with_memory(tmp_path):
    out = tmp_path / "step.json"
    argv = [TOOL, *TINY, "--family", "deepseek_v3", "--experts", "16", "--top-k", "4", "--groups", "4"]
    argv += ["--topk-group", "2", "--methods", "conventional", "ProbMoE grouped (dp)", "--json", str(out)]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["family"], r["method"]) for r in rows] == [
        ("deepseek_v3", "conventional"),
        ("deepseek_v3", "ProbMoE grouped (dp)"),
    ]
    assert all(r["peak_mib"] > 0 and r["memory_ratio"] > 0 and r["step_ratio"] > 0 for r in rows)
    assert rows[1]["experts_per_token"] == 4.0
    assert "deepseek_v3, 128 tokens per step" in done.stdout and "2 of 4 groups" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--methods", "conventional", "ProbMoE grouped (circuit)"],
            "--methods 'ProbMoE grouped (circuit)' routes within expert groups: it needs --family deepseek_v3",
        ),
        (
            ["--family", "deepseek_v3", "--experts", "16", "--groups", "3"],
            "--groups must divide --experts and 1 <= --topk-group <= --groups, got 16 experts, --groups 3, "
            "--topk-group 4",
        ),
    ],
)
def test_bad_grouping_is_one_line(args, message):
    done = subprocess.run([sys.executable, TOOL, *TINY, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == message
