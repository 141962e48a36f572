"""Benchmark of structured routing constraints: compile times, layout sizes, and routing cost as ratios
to DeepSeek-V3's stock grouped top-k measured in the same run.

    python tools/bench_constraints.py [--tokens 4096] [--sizes 64,128,256] [--groups 8] [--max-groups 4]
                                      [--k 8] [--capacity 2] [--repeats 11] [--threads 2]

1. Compile (cold: an empty cache directory; hit: the call after it) and the level layout of
   GroupLimited(N, k, G, M), GroupCapacity(N, k, G, C) and their conjunction, for each N.
2. Routing fp32 on the CPU, T tokens, N(0, 1) logits: forward + backward (to the logits) of
   probmoe.route with the group constraint (training: an exact draw, Eq. 7 weights sigmoid(r)
   normalised) and of exactly-k routing without groups, as ratios to the stock grouped top-k
   (sigmoid scores, groups ranked by their top-2 sum, top-k inside the best M groups, weights
   normalised) forward + backward; and the eval forward (the circuit's MAP) against the stock forward;
   each with the compiled circuit and with the group DP (``algorithm="dp"``, torch sweeps).
3. How often the stock grouped top-k picks the MAP subset of the group constraint (same logits).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import interleaved, table

import circuits
import circuits.kernels.select
import probmoe


def grouped_topk(r: torch.Tensor, n_group: int, topk_group: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's stock router after the logits (transformers 5.23, zero bias): (weights [T, k],
    indices [T, k])."""
    scores = r.sigmoid()
    T, N = scores.shape
    group_scores = scores.detach().view(T, n_group, -1).topk(2, dim=-1)[0].sum(-1)  # [T, G]
    group_idx = group_scores.topk(topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1).unsqueeze(-1).expand(T, n_group, N // n_group)
    idx = scores.detach().masked_fill(~mask.reshape(T, N).bool(), -torch.inf).topk(k, dim=-1, sorted=False)[1]
    w = scores.gather(1, idx)
    return w / (w.sum(-1, keepdim=True) + 1e-20), idx


def compile_rows(specs, repeats: int) -> list[tuple]:
    rows = []
    for spec in specs:
        cold, hit = [], []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                c = circuits.compile_circuit(spec, cache_dir=d)
                t1 = time.perf_counter()
                assert circuits.compile_circuit(spec, cache_dir=d).info["cache_hit"]
                hit.append(time.perf_counter() - t1)
                cold.append(t1 - t0)
        s = c.sizes()
        shapes = " ".join(f"{lv['nodes']}x{lv['max_fanin']}" for lv in c.layout.levels())
        rows.append(
            (
                spec.describe(),
                f"{statistics.median(cold) * 1e3:.0f}",
                f"{statistics.median(hit) * 1e3:.1f}",
                c.info.get("sdd_size", "-"),
                s["levels"],
                s["nodes"],
                s["elements"],
                f"{s['padding']:.2f}",
                shapes,
            )
        )
    return rows


def routing_rows(N: int, args) -> tuple[list[tuple], float]:
    G, M, k, T = args.groups, args.max_groups, args.k, args.tokens
    spec = circuits.GroupLimited(N, k, G, M)
    gen = torch.Generator().manual_seed(N)
    r = torch.randn(T, N, generator=gen).requires_grad_()
    c = torch.randn(T, k, generator=gen)
    common = dict(scores="sigmoid", normalize=True, generator=gen)
    train = {
        "stock grouped top-k": lambda: grouped_topk(r, G, M, k)[0],
        "route, GroupLimited (ProbMoE)": lambda: probmoe.route(r, constraint=spec, training=True, **common).weights,
        "route, GroupLimited, group DP": lambda: (
            probmoe.route(r, constraint=spec, training=True, algorithm="dp", **common).weights
        ),
        "route, exactly k, no groups": lambda: probmoe.route(r, k=k, training=True, **common).weights,
    }
    times = interleaved(
        {name: lambda f=f: (f() * c).sum().backward() for name, f in train.items()}, repeats=args.repeats
    )
    rows = [
        (N, "train fwd+bwd", name, f"{t * 1e3:.2f}", f"{t / times['stock grouped top-k']:.1f}x")
        for name, t in times.items()
    ]
    with torch.no_grad():
        rd = r.detach()
        evals = {
            "stock grouped top-k": lambda: grouped_topk(rd, G, M, k),
            "route, GroupLimited (MAP)": lambda: probmoe.route(rd, constraint=spec, training=False, **common),
            "route, GroupLimited (MAP), group DP": lambda: probmoe.route(
                rd, constraint=spec, training=False, algorithm="dp", **common
            ),
        }
        times = interleaved(evals, repeats=args.repeats)
        rows += [
            (N, "eval fwd", name, f"{t * 1e3:.2f}", f"{t / times['stock grouped top-k']:.1f}x")
            for name, t in times.items()
        ]
        stock = torch.zeros_like(rd).scatter_(-1, grouped_topk(rd, G, M, k)[1], 1.0)
        best = probmoe.route(rd, constraint=spec, training=False, **common).selected().float()
        agree = float((stock == best).all(-1).float().mean())
    return rows, agree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--sizes", default="64,128,256")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--max-groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--compile-repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import circuits

    sizes = [int(x) for x in args.sizes.split(",")]
    print(
        f"T = {args.tokens}, fp32, CPU, {args.threads} threads, torch {torch.__version__}; "
        f"{circuits.kernels.select.describe()}; load average {os.getloadavg()[0]:.2f} at start"
    )
    G, M, k, C = args.groups, args.max_groups, args.k, args.capacity
    specs = []
    for N in sizes:
        specs += [
            circuits.GroupLimited(N, k, G, M),
            circuits.GroupCapacity(N, k, G, C),
            circuits.GroupLimited(N, k, G, M, capacity=C),
        ]
    print("\nCompile (median of fresh cache directories) and the level layout (level: nodes x max fan-in)")
    print(
        table(
            compile_rows(specs, args.compile_repeats),
            (
                "spec",
                "cold (ms)",
                "hit (ms)",
                "SDD size",
                "levels",
                "nodes",
                "elements",
                "padding",
                "levels (nodes x fan-in)",
            ),
        )
    )
    rows, agree = [], []
    for N in sizes:
        r, a = routing_rows(N, args)
        rows += r
        agree.append((N, f"{a:.3f}"))
    print(f"\nRouting, k = {k} from at most {M} of {G} groups (ratios to the stock grouped top-k in this run)")
    print(table(rows, ("N", "pass", "routine", "median (ms)", "ratio")))
    print("\nFraction of tokens on which the stock grouped top-k picks the MAP subset (N(0, 1) logits)")
    print(table(agree, ("N", "stock == MAP")))
    print(f"\nload average {os.getloadavg()[0]:.2f} at end (the machine may be shared: compare ratios, not times)")


if __name__ == "__main__":
    main()
