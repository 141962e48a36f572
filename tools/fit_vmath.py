"""Reproduce the polynomial coefficients of circuits/kernels/c/vmath.c (EXP_Q, LOG_G).

Each is a weighted minimax fit by Lawson's algorithm (least squares, reweighted until the error is
level) in float64 at 20,001 Chebyshev points, of the relative error of the result:
  exp(r)     ~ 1 + r + r^2 Q(r),  |r| <= 0.3466 (ln 2 / 2 plus rounding slack), Q of degree 4;
  log(1 + r) ~ r + r^2 G(r),      |r| <= 1/3 (m - 1 for m in [2/3, 4/3)),     G of degree 8;
with Q0 = 1/2 and G0 = -1/2 kept from the Taylor series. The coefficients are then rounded to
float32 one at a time from the lowest degree, refitting the higher ones after each. The script
prints them, the relative error they reach, and whether they equal the ones in vmath.c.

    python tools/fit_vmath.py
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

VMATH = Path(__file__).resolve().parent.parent / "circuits" / "kernels" / "c" / "vmath.c"


def exp_q(r: np.ndarray) -> np.ndarray:
    """(e^r - 1 - r) / r^2 = sum_j r^j / (j + 2)!, summed to float64 precision for |r| < 1."""
    total, term = np.zeros_like(r), np.full_like(r, 0.5)
    for j in range(25):
        total += term
        term = term * r / (j + 3)
    return total


def log_g(r: np.ndarray) -> np.ndarray:
    """(log(1 + r) - r) / r^2 = sum_j (-1)^(j+1) r^j / (j + 2), summed for |r| <= 1/3."""
    total, power = np.zeros_like(r), np.ones_like(r)
    for j in range(80):
        total += (-1) ** (j + 1) * power / (j + 2)
        power = power * r
    return total


def lawson(f, w, a: float, deg: int, fixed: dict[int, float], points: int = 20001, iters: int = 3000) -> list[float]:
    """The coefficients c_0..c_deg (those in ``fixed`` held) minimising max_{|r|<=a} |w(r)(sum c_j r^j - f(r))|."""
    x = a * np.cos(np.pi * (np.arange(points) + 0.5) / points)  # Chebyshev points: dense near the ends
    free = [j for j in range(deg + 1) if j not in fixed]
    held = sum(c * x**j for j, c in fixed.items())
    basis = w(x)[:, None] * np.stack([(x / a) ** j for j in free], 1)  # scaled by a^j: better conditioned
    target = w(x) * (f(x) - held)
    weights = np.full(points, 1.0 / points)
    for _ in range(iters):
        s = np.sqrt(weights)
        sol = np.linalg.lstsq(basis * s[:, None], target * s, rcond=None)[0]
        weights = weights * np.abs(basis @ sol - target)
        weights /= weights.sum()
    coef = dict(fixed) | {j: sol[i] / a**j for i, j in enumerate(free)}
    return [coef[j] for j in range(deg + 1)]


def rounded_fit(f, w, a: float, deg: int, fixed: dict[int, float]) -> list[float]:
    """float32 coefficients: each rounded in turn from the lowest degree, the higher ones refitted."""
    fixed = dict(fixed)
    for j in range(deg + 1):
        if j not in fixed:
            fixed[j] = float(np.float32(lawson(f, w, a, deg, fixed)[j]))
    return [fixed[j] for j in range(deg + 1)]


def max_error(f, w, a: float, coef: list[float]) -> float:
    x = np.linspace(-a, a, 400001)
    return float(np.max(np.abs(w(x) * (sum(c * x**j for j, c in enumerate(coef)) - f(x)))))


def in_vmath(name: str) -> list[float]:
    body = re.search(rf"{name}\[\d+\] = \{{([^}}]*)\}}", VMATH.read_text()).group(1)
    return [float(np.float32(v.strip().rstrip("f"))) for v in body.split(",")]


def main() -> None:
    fits = {
        "EXP_Q": (exp_q, lambda r: r * r / np.exp(r), 0.3466, 4, {0: 0.5}),
        "LOG_G": (log_g, lambda r: r * r / np.abs(np.where(r == 0, 1, np.log1p(r))), 1 / 3, 8, {0: -0.5}),
    }
    for name, (f, w, a, deg, fixed) in fits.items():
        coef = rounded_fit(f, w, a, deg, fixed)
        same = coef == in_vmath(name)
        print(
            f"{name}: relative error {max_error(f, w, a, coef):.2g}; {'equal to' if same else 'DIFFERENT from'} vmath.c"
        )
        print("   {" + ", ".join(f"{np.float32(c)}f" for c in coef) + "}")


if __name__ == "__main__":
    main()
