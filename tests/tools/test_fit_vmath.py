"""tools/fit_vmath.py reads the coefficients it reproduces from circuits/kernels/c/vmath.c (it pointed at a
folder that had moved), and they meet the error it fits them to (the whole fit takes a minute and a
half: the script itself)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import fit_vmath


def test_the_coefficients_in_vmath_are_read_and_accurate():
    exp_coef, log_coef = fit_vmath.in_vmath("EXP_Q"), fit_vmath.in_vmath("LOG_G")
    assert len(exp_coef) == 5 and exp_coef[0] == 0.5 and len(log_coef) == 9 and log_coef[0] == -0.5
    r = np.linspace(-0.3466, 0.3466, 2000)  # not 0: 0 / 0
    approx = 1 + r + r**2 * np.polyval(exp_coef[::-1], r)
    assert np.max(np.abs(approx / np.exp(r) - 1)) < 1e-8
    r = np.linspace(-1 / 3, 1 / 3, 2000)
    approx = r + r**2 * np.polyval(log_coef[::-1], r)
    assert np.max(np.abs(approx / np.log1p(r) - 1)) < 1e-8
