"""tools/gpu: the device check. The budget rules and the report on fake parts (seconds), and the
whole script rehearsed on the CPU (slow: the wheels downloaded for the device's Python and
checked, every part run at tiny sizes), so that device minutes are never spent on a broken script."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tools" / "gpu"
sys.path.insert(0, str(GPU))
import check  # noqa: E402
import environment  # noqa: E402
import parts  # noqa: E402
import report  # noqa: E402


def sleeper(seconds: float, rc: int = 0) -> list:
    return [sys.executable, "-c", f"import time, sys; time.sleep({seconds}); sys.exit({rc})"]


@pytest.mark.slow  # long: the default run stays under 10 minutes (CI runs it with -m slow)
def test_budget_shares_cut_short_and_skip(tmp_path):
    """A step past its part's share is stopped (its process group killed) and reported cut short;
    time a part leaves unused carries to the next; a part the rest of the budget cannot hold is
    skipped with the reason; a failing step fails its part."""
    plan = [
        parts.Part("quick", 0.1, 1, steps=[("ok", sleeper(0), {})]),
        parts.Part("slow", 0.1, 1, steps=[("sleeps", sleeper(60), {}), ("after", sleeper(0), {})]),
        parts.Part("fails", 0.1, 1, steps=[("exit 3", sleeper(0, 3), {})]),
        parts.Part("hungry", 0.5, 1000, steps=[("never", sleeper(0), {})]),
        parts.Part("told", 0.1, 1, skip="no CUDA device"),
    ]
    t0 = time.monotonic()
    got = check.run_parts(plan, budget_s=100, started=t0, out=tmp_path, env=dict(os.environ))
    assert time.monotonic() - t0 < 40  # the 60 s sleep was stopped at its share (10 s plus carry)
    status = {p["part"]: p for p in got}
    assert status["quick"]["status"] == "passed"
    assert status["slow"]["status"] == "cut short" and status["slow"]["steps"][0]["status"] == "cut short"
    assert 10 <= status["slow"]["steps"][0]["seconds"] < 25  # its 10 s share plus what "quick" left
    assert status["slow"]["steps"][1]["status"] == "skipped"
    assert status["fails"]["status"] == "failed" and status["fails"]["steps"][0]["returncode"] == 3
    assert "tail" in status["fails"]["steps"][0] and "tail" not in status["quick"]["steps"][0]
    assert status["hungry"]["status"] == "skipped" and "needs 1000 s" in status["hungry"]["reason"]
    assert status["told"] == {**status["told"], "status": "skipped", "reason": "no CUDA device"}
    assert (tmp_path / "slow.log").read_text().count("cut short") == 1


def test_report_reads_what_the_parts_wrote(tmp_path):
    """Per-test outcomes from the plugin's lines, the benchmark rows with their goals (CUDA rows
    only), and a half-written file read as missing rather than trusted."""
    tests = tmp_path / "tests.jsonl"
    tests.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                dict(suite="device", test="a", outcome="passed", seconds=0.1, message=""),
                dict(suite="device", test="b", outcome="failed", seconds=0.1, message="AssertionError: 2 != 3"),
                dict(suite="triton", test="c", outcome="skipped", seconds=0, message="Skipped: CUDA only"),
            ]
        )
    )
    router = tmp_path / "router.json"
    router.write_text(
        json.dumps(
            [
                dict(
                    device="cuda",
                    dtype="float32",
                    tokens=65536,
                    constraint="exactly 8 of 64",
                    routine="route dp",
                    seconds=1e-3,
                    ratio=0.2,
                    saved_mib=4.0,
                ),
                dict(
                    device="cuda",
                    dtype="float32",
                    tokens=65536,
                    constraint="exactly 16 of 256",
                    routine="route circuit (triton)",
                    seconds=3e-3,
                    ratio=2.5,
                    saved_mib=9.0,
                ),
            ]
        )
    )
    step = tmp_path / "step.json"
    step.write_text('{"rows": [{"method": "conventional", "seconds": 0.1')  # cut short mid-write
    profile = tmp_path / "profile.json"
    timing = dict(wall_one=2e-3, wall_queued=1.5e-3, host=1e-3, kernels=5e-4, graph=None, graph_failed="x")
    base = dict(wall_one=1e-3, wall_queued=1e-3, host=5e-4, kernels=2.5e-4, graph=None, graph_failed="x")
    profile.write_text(
        json.dumps(
            [
                dict(
                    constraint="exactly 8 of 64",
                    tokens=65536,
                    dtype="float32",
                    routines={"softmax + topk": base, "route dp": timing},
                )
            ]
        )
    )
    grouped = tmp_path / "grouped.json"
    row = dict(seconds=0.2, tokens_per_s=8e4, peak_mib=900.0, experts_per_token=8.0, family="deepseek_v3")
    grouped.write_text(
        json.dumps(
            dict(
                rows=[
                    dict(row, method="conventional", step_ratio=1.0, memory_ratio=1.0),
                    dict(row, method="ProbMoE grouped (circuit)", step_ratio=1.04, memory_ratio=1.03),
                ]
            )
        )
    )
    files = dict(
        tests=str(tests),
        bench_router=str(router),
        bench_step=str(step),
        bench_step_grouped=str(grouped),
        profile_route=str(profile),
    )
    got = report.collect([dict(files=files)])
    assert [t["outcome"] for t in got["tests"]] == ["passed", "failed", "skipped"] and got["bench_step"] == []
    assert [r["method"] for r in got["bench_step_grouped"]] == ["conventional", "ProbMoE grouped (circuit)"]
    md = report.markdown(
        dict(
            mode="cuda",
            budget_s=420,
            seconds=400,
            olmoe_layers=2,
            about=dict(
                nvidia_smi=dict(gpus=[dict(name="NVIDIA H100 80GB HBM3", driver="580.1", memory="81559 MiB")]),
                torch="2.11.0",
                cuda="13.0",
                triton="3.6.0",
                python="3.12.3",
                cpu=dict(name="x", cores=16),
            ),
            parts=[
                dict(
                    part="tests",
                    status="failed",
                    steps=[
                        dict(step="s", status="failed", seconds=3, returncode=2, tail=["ERROR collecting tests/x.py"])
                    ],
                )
            ],
            results=got,
        )
    )
    assert "NVIDIA H100 80GB HBM3 (driver 580.1" in md and "| device | 1 | 1 | 0 | 0 |" in md
    assert "`b`: AssertionError: 2 != 3" in md and "1 × CUDA only" in md
    assert "met (≤ 0.25×)" in md and "missed (≤ 0.5×)" in md
    assert (
        "| float32 | 65536 | exactly 8 of 64 | route dp | 2.000 (2.00×) | 1.500 (1.50×) | 1.000 (2.00×) | 0.500 (2.00×) | — |"
        in md
    )
    assert "tests, s: failed (return code 2)" in md and "ERROR collecting tests/x.py" in md
    assert "## A 256-expert grouped step" in md and "| time met, memory met |" in md  # 1.04 and 1.03 <= 1.05


def test_layers_that_fit():
    assert parts.olmoe_layers(80 * 2**30) == 2  # an H100: two bf16 copies with AdamW (one method per process)
    assert parts.olmoe_layers(80 * 2**30, copies=5) == 1  # five at once ran out of memory at two layers
    assert parts.olmoe_layers(141 * 2**30) >= 4 and parts.olmoe_layers(2**30) == 1


def test_bad_arguments():
    done = subprocess.run(["bash", str(GPU / "check.sh")], capture_output=True, text=True)
    assert done.returncode == 2 and "usage: bash tools/gpu/check.sh OUT_DIR" in done.stderr
    done = subprocess.run(["bash", str(GPU / "check.sh"), "/tmp/x", "--budget"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown argument --budget" in done.stderr


@pytest.mark.slow  # downloads 20 MiB of wheels and runs every part at tiny sizes: minutes on two cores
def test_rehearsal_end_to_end(tmp_path):
    """wheels.sh, then check.sh --rehearse: every part passes on the CPU, CUDA-only tests are
    reported skipped with the reason, and what comes back is at most 8 files in one folder."""
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    made = subprocess.run(["bash", str(GPU / "wheels.sh"), str(wheels)], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    done = subprocess.run(
        ["bash", str(GPU / "check.sh"), str(out), "--rehearse", "--budget-s", "1500", "--wheels", str(wheels)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=tmp_path,
    )
    summary = json.loads((out / "gpu.json").read_text())
    assert done.returncode == 0, (done.stdout[-3000:], (out / "gpu.md").read_text())
    assert {p["part"]: p["status"] for p in summary["parts"]} == dict.fromkeys(
        ("tests", "bench_router", "bench_step", "commands"), "passed"
    ), (out / "gpu.md").read_text()
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.is_file() and f.stat().st_size < 16 * 2**20 for f in files)
    res = summary["results"]
    assert {t["suite"] for t in res["tests"]} == {"device", "triton", "triton lattice", "triton groups"}
    assert any(t["outcome"] == "skipped" and "CUDA only" in t["message"] for t in res["tests"])
    assert {r["dtype"] for r in res["bench_router"]} == {"float32", "bfloat16"}
    assert {r["method"] for r in res["bench_step"]} == set(parts.STEP_METHODS)
    grouped_steps = [r["method"] for r in res["bench_step_grouped"]]
    assert grouped_steps == ["conventional", "ProbMoE grouped (dp)", "ProbMoE grouped (circuit)"]  # one baseline kept
    grouped = {r["routine"] for r in res["bench_router"] if r["constraint"] == "2 of 16 in <= 2 of 4 groups"}
    assert grouped == {"softmax + topk", "route dp", "route circuit"}
    assert res["eval"]["experts_per_token"] > 0 and res["analysis"]["runs"] >= 1
    wanted = len(environment.carried())  # one wheel per package tools/gpu/wheels.txt names
    assert f"{wanted} wheels checked for CPython 3.12" in (out / "install.log").read_text()
