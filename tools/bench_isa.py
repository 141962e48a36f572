"""bench_router.py's measure for each instruction set the CPU runs, in one interleaved run.

    python tools/bench_isa.py [--tokens 4096] [--sizes 64:8,64:4-8,128:8,256:16] [--isas avx512,avx2,portable]
                              [--repeats 15] [--threads 2] [--torch-isa matched|native]

Builds the kernels' C library (circuit passes, row operations, cardinality DP) for each ISA
(``NativeLibrary.variant``: avx512 = -march=x86-64-v4, avx2 = -march=x86-64-v3, portable =
-march=x86-64-v2, each tuned for this CPU; those the CPU lacks are skipped) and times
route(training=True) forward + backward for each backend and ISA against softmax + topk forward +
backward, all round-robin in the same run, so the machine's load hits every column alike. The
ratios are bench_router.py's; this script only swaps which build the library points to between
calls. An AVX2 build on an AVX-512 CPU is a proxy for an AVX2-only CPU, not the same thing.

``--torch-isa matched`` (the default) makes the proxy closer: torch's own kernels (the softmax +
topk baseline, and the torch operations inside ``route``) run at the same instruction set, as on a
CPU that lacks the others (``ATEN_CPU_CAPABILITY`` = avx512 / avx2 / default for the portable
build). torch reads that once per process, so each ISA then runs in a child process of its own
(the ratios stay within one run: baseline and routes interleaved in that child). ``native`` runs
every ISA in one interleaved process with torch on the best kernels this CPU has.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_router import parse_size, softmax_topk
from timing import table

import circuits
import probmoe
from circuits.kernels import build, library
from circuits.kernels.c_passes import CPasses
from circuits.kernels.rows import Rows
from probmoe import constraints

LIBS = (library.LIBRARY,)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def use(isa: str, circuit) -> None:
    """Point the library (and ``circuit``'s fp32 passes) at the build for ``isa``."""
    for lib in LIBS:
        lib.state = {"lib": lib.variant(isa), "where": f"{isa} build", "isa": isa}
    if circuit is not None:
        circuit._passes[torch.float32] = PASSES[(isa, id(circuit))]


PASSES: dict = {}
ATEN = {"avx512": "avx512", "avx2": "avx2", "portable": "default"}  # ATEN_CPU_CAPABILITY per build


def run_matched(args: argparse.Namespace, isas: list[str]) -> None:
    """This script once per ISA in a child process whose torch kernels use that ISA too."""
    same = [
        "--tokens",
        str(args.tokens),
        "--sizes",
        args.sizes,
        "--backends",
        args.backends,
        "--repeats",
        str(args.repeats),
        "--threads",
        str(args.threads),
    ]
    for isa in isas:
        env = {**os.environ, "ATEN_CPU_CAPABILITY": ATEN[isa]}
        print(f"--- {isa} build, torch kernels at ATEN_CPU_CAPABILITY={ATEN[isa]} ---", flush=True)
        subprocess.run([sys.executable, __file__, *same, "--isas", isa, "--torch-isa", "native"], env=env, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--sizes", default="64:8,64:4-8,128:8,256:16")
    ap.add_argument("--isas", default=",".join(build.ISAS))
    ap.add_argument("--backends", default="circuit,dp")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch-isa", choices=("matched", "native"), default="matched")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runnable = build.runnable_isas()
    isas = [i for i in args.isas.split(",") if i in runnable]
    skipped = [i for i in args.isas.split(",") if i not in runnable]
    if args.torch_isa == "matched" and len(isas) > 1:
        return run_matched(args, isas)
    for isa in isas:
        for lib in LIBS:
            lib.variant(isa)
    print(
        f"{cpu_name()}; ISAs: {', '.join(isas)}"
        + (f" (skipped, the CPU lacks them: {', '.join(skipped)})" if skipped else "")
        + f"; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()} kernels), {args.threads} threads, "
        f"T = {args.tokens}; "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    gen = torch.Generator().manual_seed(0)
    out = []
    for text in args.sizes.split(","):
        label, N, size = parse_size(text)
        kmin, kmax = size.get("k", size.get("kmin")), size.get("kmax", size.get("k"))
        r = (torch.randn(args.tokens, N, generator=gen) * 2).requires_grad_()
        c = torch.randn(args.tokens, kmax, generator=gen)
        circuit = constraints.cardinality(N, kmin, kmax, "cpu")
        for isa in isas:
            use(isa, None)
            PASSES[(isa, id(circuit))] = CPasses(circuit.program, circuits.passes.select(Rows(r.device), r.dtype))
        fns = {"softmax + topk": (None, lambda: (softmax_topk(r, kmax) * c).sum().backward())}
        for backend in args.backends.split(","):
            for isa in isas:
                fns[f"{backend} [{isa}]"] = (
                    isa,
                    (
                        lambda b: (
                            lambda: (
                                (probmoe.route(r, **size, training=True, algorithm=b, generator=gen).weights * c)
                                .sum()
                                .backward()
                            )
                        )
                    )(backend),
                )
        times: dict[str, list[float]] = {k: [] for k in fns}
        for rep in range(args.repeats + 2):
            for name, (isa, f) in fns.items():
                if isa:
                    use(isa, circuit)
                t0 = time.perf_counter()
                f()
                if rep >= 2:
                    times[name].append(time.perf_counter() - t0)
        base = times["softmax + topk"]
        for name in fns:
            if name == "softmax + topk":
                continue
            ratios = sorted(t / b for t, b in zip(times[name], base))  # per round: the same moment's load
            med = statistics.median(times[name]) / statistics.median(base)
            out.append(
                (
                    label,
                    name,
                    f"{statistics.median(times[name]) * 1e3:.2f}",
                    f"{med:.2f}x",
                    f"{ratios[len(ratios) // 4]:.2f}–{ratios[(3 * len(ratios)) // 4]:.2f}x",
                )
            )
        out.append((label, "softmax + topk", f"{statistics.median(base) * 1e3:.2f}", "1.00x", ""))
    print(
        table(
            out,
            ("constraint", "routine [ISA]", "median fwd+bwd (ms)", "ratio of medians", "per-round ratio, quartiles"),
        )
    )
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
