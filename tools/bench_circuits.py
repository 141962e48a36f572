"""Benchmark of the circuits engine: compile times and evaluation as ratios to softmax + top-k.

    python tools/bench_circuits.py [--tokens 4096] [--threads 2] [--repeats 15]

Everything is measured in this run; evaluation times are reported as ratios to a softmax +
torch.topk forward and backward on the same logits (absolute times are printed for context).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from timing import circuit_passes, interleaved, table

import circuits


def compile_times(spec, repeats: int) -> tuple[float, float]:
    """(cold, hit): wall seconds of compile_circuit on an empty cache directory (compile and
    write the entry) and of the call after it (load and verify), medians over fresh directories."""
    cold, hit = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            circuits.compile_circuit(spec, cache_dir=d)
            t1 = time.perf_counter()
            h = circuits.compile_circuit(spec, cache_dir=d)
            t2 = time.perf_counter()
            assert h.info["cache_hit"]
            cold.append(t1 - t0)
            hit.append(t2 - t1)
    return statistics.median(cold), statistics.median(hit)


def process_times(repeats: int) -> tuple[float, float]:
    """(command, import torch): median wall seconds of the whole ``probmoe-compile --n 64 --k 8``
    process on a cache hit and of ``python -c "import torch"``, interleaved."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PROBMOE_CACHE": d}
        command = [
            sys.executable,
            "-c",
            "from circuits.inspect.cli import compile_main; compile_main()",
            "--n",
            "64",
            "--k",
            "8",
        ]
        subprocess.run(command, env=env, check=True, capture_output=True)  # compile once: later runs hit
        runs = {
            "command": lambda: subprocess.run(command, env=env, check=True, capture_output=True),
            "torch": lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True),
        }
        times = interleaved(runs, repeats=repeats, warmup=1)
    return times["command"], times["torch"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    rows = []
    for spec in (circuits.ExactlyK(64, 8), circuits.ExactlyK(512, 32)):
        cold, hit = compile_times(spec, 5)
        rows.append((spec.describe(), f"{cold * 1e3:.1f} ms", f"{hit * 1e3:.1f} ms", f"{cold / hit:.1f}x"))
    print("## Compile\n")
    print(table(rows, ("spec", "cold compile", "cache hit", "cold / hit")))
    command, torch_import = process_times(7)
    print(
        f"\nprobmoe-compile --n 64 --k 8 on a cache hit, the whole process: {command:.2f} s, "
        f"{command / torch_import:.2f}x python -c 'import torch' ({torch_import:.2f} s)"
    )

    T, k = args.tokens, 8
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(T, 64, generator=gen).requires_grad_()
    v = torch.randn(T, 64, generator=gen)
    exact, ranged = (circuits.compile_circuit(s) for s in (circuits.ExactlyK(64, k), circuits.RangeK(64, 4, 8)))

    def topk():
        w, _ = torch.softmax(r, -1).topk(k, dim=-1)
        w.sum().backward()

    def lz_fwd_bwd(c):
        def run():
            c.log_partition(r).sum().backward()  # upward pass, then the downward pass (r.grad = m - p)

        return run

    def lz_and_m(c):
        def run():
            (c.log_partition(r).sum() + (c.marginals(r) * v).sum()).backward()

        return run

    def m_only(c):
        def run():
            (c.marginals(r) * v).sum().backward()

        return run

    def fused(c):
        def run():
            m, _ = c.marginals_and_sample(r)
            (m * v).sum().backward()

        return run

    def no_grad(f):
        def run():
            with torch.no_grad():
                f(r)

        return run

    fns = {"softmax + topk (fwd+bwd)": topk}
    for name, c in (("exactly 8 of 64", exact), ("range 4..8 of 64", ranged)):
        fns[f"{name}: log_partition fwd + bwd (marginals by the downward pass)"] = lz_fwd_bwd(c)
        fns[f"{name}: log_partition and marginals, both fwd+bwd"] = lz_and_m(c)
        fns[f"{name}: marginals fwd + bwd (Cov(z) v)"] = m_only(c)
        fns[f"{name}: sample"] = no_grad(c.sample)
        fns[f"{name}: marginals + sample fused (fwd+bwd)"] = fused(c)
        fns[f"{name}: map"] = no_grad(c.map)
    med = interleaved(fns, repeats=args.repeats)
    base = med["softmax + topk (fwd+bwd)"]
    rows = [(name, f"{t * 1e3:.2f} ms", f"{t / base:.1f}x") for name, t in med.items()]
    print(f"\n## Evaluation, T = {T} tokens, fp32, {args.threads} threads, {circuit_passes()}\n")
    print(table(rows, ("routine", "median", "ratio to softmax + topk")))


if __name__ == "__main__":
    main()
