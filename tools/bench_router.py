"""Benchmark route(training=True) forward + backward against softmax + topk, in the same run.

    python tools/bench_router.py [--tokens 4096] [--experts 64] [--repeats 15] [--threads 2]

For exactly-k (k = 8) and Dynamic-k (4..8), fp32, CPU: the median time of route(training=True)
forward + backward (to the logits) for each backend as a ratio to softmax + topk forward +
backward (interleaved repeats, so drift hits all alike), and the bytes the autograd graph keeps for
the backward (distinct storages seen by ``torch.autograd.graph.saved_tensors_hooks``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import circuit_passes, interleaved, table  # noqa: E402

import probmoe  # noqa: E402


def softmax_topk(r: torch.Tensor, k: int) -> torch.Tensor:
    """The HF baseline: top-k of the softmax, weights = the top-k probabilities."""
    return torch.topk(torch.softmax(r, dim=-1), k).values


def saved_bytes(fn) -> int:
    """Bytes held for backward by the graph ``fn`` builds (distinct storages)."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    T, N = args.tokens, args.experts
    gen = torch.Generator().manual_seed(0)
    r = (torch.randn(T, N, generator=gen) * 2).requires_grad_()
    probmoe.route(r.detach()[:2], k=8, training=False, backend="circuit")  # compile / load the circuits once
    print(f"T = {T}, N = {N}, fp32, CPU, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{circuit_passes()}, load average {os.getloadavg()[0]:.2f} at start")
    rows = []
    for label, size in [("exactly 8", dict(k=8)), ("range 4..8", dict(kmin=4, kmax=8))]:
        kmax = size.get("k", size.get("kmax"))
        c = torch.randn(T, kmax, generator=gen)
        fwd = {"softmax + topk": lambda: softmax_topk(r, kmax)}
        for backend in ("dp", "circuit"):
            fwd[f"route {backend}"] = (lambda b: lambda: probmoe.route(r, **size, training=True, backend=b,
                                                                       generator=gen).weights)(backend)

        def step(f):
            return lambda: (f() * c).sum().backward()

        times = interleaved({name: step(f) for name, f in fwd.items()}, repeats=args.repeats)
        base = times["softmax + topk"]
        for name, f in fwd.items():
            mib = saved_bytes(f) / 2**20
            rows.append((label, name, f"{times[name] * 1e3:.1f}", f"{times[name] / base:.1f}x", f"{mib:.2f}"))
    print(table(rows, ("constraint", "routine", "median fwd+bwd (ms)", "ratio to softmax + topk", "saved for backward (MiB)")))
    print(f"load average {os.getloadavg()[0]:.2f} at end (the machine may be shared: compare ratios, not times)")


if __name__ == "__main__":
    main()
