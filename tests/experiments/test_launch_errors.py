"""probmoe-launch as a new user meets it (issue 42, point 5.5): a rank's input error is that rank's
one line and status 2 (not torchrun's ChildFailedError traceback and status 1), another failure
one line naming the rank and its status, and a bad --nproc_per_node one line before anything starts."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from probmoe.cli import launch

ROOT = Path(__file__).resolve().parents[2]


def run(*argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "probmoe.cli.launch", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # torchrun's own banner about OMP_NUM_THREADS is not ours to remove
    lines = [line for line in done.stderr.splitlines() if "torch/distributed/run.py" not in line]
    return done.returncode, lines, done.stderr


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_nproc_per_node_is_one_line_naming_the_allowed_values(capsys, value):
    assert launch.main(["--nproc_per_node", value, "-m", "probmoe.cli.train"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("probmoe-launch: error: --nproc_per_node must be a number of processes >= 1")
    assert "auto, cpu, gpu, xpu" in err and value in err


def test_a_good_nproc_per_node_passes_the_check():
    for value in ("1", "8", "auto", "cpu"):
        assert launch.check_nproc(["--nproc_per_node", value, "-m", "probmoe.cli.train"]) is None


@pytest.mark.slow  # two ranks importing transformers (about 9 s); the slow set runs it
def test_a_ranks_input_error_is_its_one_line_and_status_2():
    pytest.importorskip("transformers")
    code, lines, err = run("--standalone", "--nproc_per_node", "2", "-m", "probmoe.cli.train", "--batch-size", "0")
    assert code == 2, err[-4000:]
    assert lines == [
        "probmoe-train: error: argument --batch-size: must be an integer >= 1 (finite), got 0 "
        "(see probmoe-train --help)"
    ], err[-4000:]


def test_another_failure_names_the_rank_and_its_status(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('rank went wrong', file=sys.stderr)\nsys.exit(3)\n")
    code, lines, err = run("--standalone", "--nproc_per_node", "1", str(script))
    assert code == 3, err[-4000:]
    assert lines == ["rank went wrong", "probmoe-launch: rank 0 failed (status 3); its output above says why"], err


class _Failure:
    def __init__(self, exitcode, timestamp):
        self.exitcode, self.timestamp = exitcode, timestamp


class _Failed:
    def __init__(self, **failures):
        self.failures = {int(rank[1:]): failure for rank, failure in failures.items()}


def test_the_rank_that_ended_by_itself_is_reported_not_the_one_torchrun_stopped(capsys):
    # rank 1's input error (status 2); torchrun then ended rank 0 with SIGTERM: status 2, no line
    assert launch.failed(_Failed(r0=_Failure(-15, 10.0), r1=_Failure(2, 11.0))) == 2
    assert capsys.readouterr().err == ""
    # two ranks ended by themselves: the earlier one
    assert launch.failed(_Failed(r0=_Failure(3, 12.0), r1=_Failure(4, 11.0))) == 4
    assert "rank 1 failed (status 4)" in capsys.readouterr().err
    # only signals (a rank killed from outside): the earliest, as 128 + the signal
    assert launch.failed(_Failed(r0=_Failure(-15, 12.0), r1=_Failure(-9, 11.0))) == 137
    assert "rank 1 failed (signal 9)" in capsys.readouterr().err
