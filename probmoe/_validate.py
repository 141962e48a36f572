"""Argument checks shared by the distribution, ``route`` and the router.

Every failure is a ``ValueError`` that names the argument and the allowed range. Shape and
integer checks are free; the checks on logit values (NaN, +inf, huge, a cardinality range that
-inf logits make infeasible) cost one host synchronisation on the CPU, are asynchronous
assertions in the graph on CUDA (no host synchronisation; a failure is a device-side assert:
``circuits.checks``) and under torch.compile, and can be skipped. The checks circuits
makes too (logits, generators, integer ranges, k / kmin / kmax) live in ``circuits.checks`` (one
home, one message); this module names them in routing's terms.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from circuits import checks

generator, logits_tensor = checks.generator, checks.logits  # probmoe's entry points use these

int_in = checks.integer  # int_in(name, value, lo, hi, note): an int in [lo, hi], else ValueError naming it


def choice(name: str, value, options) -> str:
    """``value`` if it is one of ``options``, else ValueError naming ``name``."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got {value!r}")
    return value


def cardinality(n: int, k=None, kmin=None, kmax=None, *, lowest: int = 0) -> tuple[int, int]:
    """``circuits.checks.cardinality`` over N = ``n`` experts: (kmin, kmax), lowest <= kmin <= kmax <= n."""
    return checks.cardinality(n, k, kmin, kmax, lowest=lowest, note=f" (N = {n} experts)")


@torch.no_grad()
def logits_values(logits: Tensor, kmin: int) -> bool:
    """Raise for NaN, +inf or huge finite logits (|r| >= ``checks.MAX_ABS_LOGIT``), or rows with
    fewer than ``kmin`` logits above -inf. Returns whether some logit may be -inf (always True where
    the checks are assertions in the graph).

    On the CPU one host synchronisation for the global minimum and maximum (NaN propagates into
    both); rows are looked at only when some logit is -inf, and the offending row is located only
    on failure. On CUDA and under torch.compile the same conditions are asserted inside the graph,
    with no host synchronisation (``checks.in_graph``, ``checks.require``).
    """
    if logits.numel() == 0:
        return False
    if checks.in_graph(logits):
        _logits_values_in_graph(logits, kmin)
        return True
    bottom, top = torch.stack(torch.aminmax(logits)).tolist()
    if math.isnan(top) or top == math.inf:
        checks.logit_values(logits)
    low = bottom if bottom > -math.inf else torch.where(logits > -torch.inf, logits, 0.0).amin().item()
    if max(top, -low) >= checks.MAX_ABS_LOGIT:
        raise ValueError(f"{checks.HUGE}, got {top if top >= -low else low:g}")
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


def _logits_values_in_graph(logits: Tensor, kmin: int) -> None:
    """``logits_values``'s conditions as assertions kept in the graph, with no host synchronisation
    (``checks.require``); ``validate_args=False`` leaves them out."""
    checks.logit_values(logits)
    if kmin > 0:
        live = (logits > -torch.inf).sum(-1)  # [...]
        checks.require(
            live.amin() >= kmin,
            f"some row of the logits has fewer than kmin = {kmin} experts above -inf: the constraint is infeasible",
        )


class Number:
    """A number option's check, declared once: ``Number(int, 1)`` is an integer >= 1, ``Number(float,
    0, inclusive=False)`` a finite number > 0. Called on a command line's text (an argparse
    ``type``: ``argparse.ArgumentTypeError`` "must be an integer >= 1 (finite), got 0"), or
    ``check(name, value)`` on a Python value (ValueError "k must be an integer >= 1, got 0")."""

    def __init__(self, kind: type, low: float, *, inclusive: bool = True):
        self.kind, self.low, self.inclusive = kind, low, inclusive
        self.what = "an integer" if kind is int else "a number"
        self.bound = f"{'>=' if inclusive else '>'} {low:g}"
        self.__name__ = f"{kind.__name__} {self.bound}"  # argparse names the type by it

    def _ok(self, value) -> bool:
        return (value >= self.low if self.inclusive else value > self.low) and value != math.inf

    def __call__(self, text: str):
        import argparse

        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {self.what} {self.bound}, got {text!r}") from None
        if not self._ok(value):
            raise argparse.ArgumentTypeError(f"must be {self.what} {self.bound} (finite), got {text}")
        return value

    def check(self, name: str, value):
        """``value`` (None passes) as ``kind``, else ValueError naming ``name``."""
        if value is None:
            return None
        number = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, number) or math.isnan(value) or not self._ok(value):
            what = "an integer" if self.kind is int else "a finite number"
            raise ValueError(f"{name} must be {what} {self.bound}, got {value!r}")
        return self.kind(value)


def one_of(name: str, value, options) -> str | None:
    """``value`` if it is None or one of ``options``, else ValueError "name must be one of 'a', 'b', got ..."."""
    if value is not None and (not isinstance(value, str) or value not in options):
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value
