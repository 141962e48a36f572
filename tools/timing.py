"""Shared benchmark helpers: interleaved repeats and medians, ratios to a baseline from the same run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved(
    fns: dict[str, Callable[[], object]],
    repeats: int = 15,
    warmup: int = 2,
    stat: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """Median seconds of each function (or another ``stat`` of its repeats, e.g. ``min`` on a loaded
    machine), running them round-robin so drift hits all alike."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    return {k: stat(v) for k, v in times.items()}


def table(rows: list[tuple], header: tuple) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def circuit_passes() -> str:
    """Which circuit passes fp32 CPU calls take in this run (set PROBMOE_NATIVE=0 for the torch ones)."""
    from circuits.kernels.select import describe

    return f"circuit passes: {describe()}"
