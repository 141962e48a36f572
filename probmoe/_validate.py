"""Argument checks shared by the distribution, ``route`` and the router.

Every failure is a ``ValueError`` that names the argument and the allowed range. Shape and
integer checks are free; the checks on logit values (NaN, +inf, a cardinality range that -inf
logits make infeasible) cost one host synchronisation and can be skipped. The checks on logits
and generators that circuits make too live in ``circuits.checks`` (one home, one message).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from circuits import checks
from circuits.checks import generator, logits as logits_tensor  # noqa: F401 (probmoe's entry points use these)

MAX_ABS_LOGIT = 1e20  # the DP's tilted sums of up to 2**31 logits stay far above its log-zero, -1e30


def int_in(name: str, value, lo: int, hi: int, note: str = "") -> int:
    """``value`` as an int in [lo, hi], else ValueError naming ``name`` (``note`` follows the range)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}]{note}, got {int(value)}")
    return int(value)


def choice(name: str, value, options) -> str:
    """``value`` if it is one of ``options``, else ValueError naming ``name``."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got {value!r}")
    return value


def cardinality(n: int, k=None, kmin=None, kmax=None, *, lowest: int = 0) -> tuple[int, int]:
    """Resolve ``k`` (exactly k) or ``kmin``/``kmax`` (a range) into (kmin, kmax) with lowest <= kmin <= kmax <= n.

    A missing ``kmin`` defaults to ``lowest``, a missing ``kmax`` to n.
    """
    if k is not None:
        if kmin is not None or kmax is not None:
            raise ValueError("pass either k (exactly k) or kmin/kmax (a range), not both")
        k = int_in("k", k, lowest, n, f" (N = {n} experts)")
        return k, k
    if kmin is None and kmax is None:
        raise ValueError("pass k (exactly k experts) or kmin and kmax (a range of sizes)")
    kmin = int_in("kmin", lowest if kmin is None else kmin, lowest, n, f" (N = {n} experts)")
    kmax = int_in("kmax", n if kmax is None else kmax, lowest, n, f" (N = {n} experts)")
    if kmin > kmax:
        raise ValueError(f"kmin must be <= kmax, got kmin = {kmin}, kmax = {kmax}")
    return kmin, kmax


@torch.no_grad()
def logits_values(logits: Tensor, kmin: int) -> bool:
    """Raise for NaN, +inf or huge finite logits (|r| >= ``MAX_ABS_LOGIT``), or rows with fewer than
    ``kmin`` logits above -inf. Returns whether some logit is -inf (always True under torch.compile).

    One host synchronisation for the global minimum and maximum (NaN propagates into both); rows
    are looked at only when some logit is -inf, and the offending row is located only on failure.
    Under torch.compile the same conditions are asserted inside the graph (``checks.require``).
    """
    if logits.numel() == 0:
        return False
    if torch.compiler.is_compiling():
        _traced_logits_values(logits, kmin)
        return True
    bottom, top = torch.stack(torch.aminmax(logits)).tolist()
    if math.isnan(top) or top == math.inf:
        checks.no_nan_or_posinf(logits)
    low = bottom if bottom > -math.inf else torch.where(logits > -torch.inf, logits, 0.0).amin().item()
    if max(top, -low) >= MAX_ABS_LOGIT:
        raise ValueError(f"logits must be -inf or finite with |logits| < {MAX_ABS_LOGIT:g}, "
                         f"got {top if top >= -low else low:g}")
    if bottom > -math.inf or kmin == 0:
        return bottom == -math.inf
    live = (logits > -torch.inf).sum(-1)  # [...]
    if int(live.min()) < kmin:
        row = tuple((live < kmin).nonzero()[0].tolist())
        raise ValueError(
            f"logits at row {row} have only {int(live[row])} experts above -inf, but kmin = {kmin} "
            "must be chosen: the constraint is infeasible"
        )
    return True


def _traced_logits_values(logits: Tensor, kmin: int) -> None:
    """``logits_values``'s conditions as assertions that torch.compile keeps in the graph, with no
    host synchronisation (``checks.require``); ``validate_args=False`` leaves them out."""
    checks.no_nan_or_posinf(logits)
    finite = torch.where(logits > -torch.inf, logits, 0.0)  # [..., N]
    checks.require(finite.abs().amax() < MAX_ABS_LOGIT, f"logits must be -inf or finite with |logits| < {MAX_ABS_LOGIT:g}")
    if kmin > 0:
        live = (logits > -torch.inf).sum(-1)  # [...]
        checks.require(live.amin() >= kmin, f"some row of the logits has fewer than kmin = {kmin} experts above "
                                            "-inf: the constraint is infeasible")
