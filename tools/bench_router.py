"""Benchmark route(training=True) forward + backward against softmax + topk, in the same run.

    python tools/bench_router.py [--tokens T] [--sizes 64:8,64:4-8] [--devices cpu,cuda]
                                 [--repeats 15] [--threads 2] [--compiled] [--stat median|min]

For each device (default: the CPU at T = 4096 tokens, and CUDA at T = 65,536 when there is one;
``--tokens`` sets both) and each constraint (N:k for
exactly k of N experts, N:a-b for a..b), fp32: the median time of route(training=True) forward +
backward (to the logits) for each backend as a ratio to softmax + topk forward + backward on the
same device (interleaved repeats, so drift hits all alike), and the bytes the autograd graph keeps
for the backward (distinct storages seen by ``torch.autograd.graph.saved_tensors_hooks``);
with ``--compiled`` also each backend under torch.compile(fullgraph=True). Each
table says which circuit passes ran on that device.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import interleaved, table  # noqa: E402

import probmoe  # noqa: E402
from probmoe import constraints  # noqa: E402


STATS = {"median": statistics.median, "min": min}


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


def parse_size(text: str) -> tuple[str, int, dict]:
    """'64:8' -> ('exactly 8 of 64', 64, {k: 8}); '64:4-8' -> ('range 4..8 of 64', 64, {kmin: 4, kmax: 8})."""
    n, _, k = text.partition(":")
    if "-" in k:
        a, b = k.split("-")
        return f"range {a}..{b} of {n}", int(n), dict(kmin=int(a), kmax=int(b))
    return f"exactly {k} of {n}", int(n), dict(k=int(k))


def timed(fn, device: torch.device):
    """``fn`` followed by a device synchronisation (CUDA work is asynchronous)."""
    if device.type != "cuda":
        return fn
    return lambda: (fn(), torch.cuda.synchronize(device))


def compiled_route(size: dict, backend: str):
    """``probmoe.route`` (training, default generator) under ``torch.compile(fullgraph=True)``:
    r [T, N] -> weights [T, kmax]. Routing is registered operators, so the graph is whole."""
    return torch.compile(lambda x: probmoe.route(x, **size, training=True, backend=backend).weights, fullgraph=True)


def bench_device(device: torch.device, sizes: list[str], T: int, repeats: int, compiled: bool = False,
                 stat: str = "median") -> None:
    gen = torch.Generator(device=device).manual_seed(0)
    rows, passes = [], set()
    for text in sizes:
        label, N, size = parse_size(text)
        kmax = size.get("k", size.get("kmax"))
        r = (torch.randn(T, N, generator=gen, device=device) * 2).requires_grad_()
        c = torch.randn(T, kmax, generator=gen, device=device)
        fwd = {"softmax + topk": lambda: softmax_topk(r, kmax)}
        for backend in ("dp", "circuit"):
            fwd[f"route {backend}"] = (lambda b: lambda: probmoe.route(r, **size, training=True, backend=b,
                                                                       generator=gen).weights)(backend)
            if compiled:
                fn = compiled_route(size, backend)
                fn(r)  # compile outside the timed runs
                fwd[f"route {backend} compiled"] = (lambda g: lambda: g(r))(fn)
        kmin = size.get("k", size.get("kmin"))
        passes.add(constraints.cardinality(N, kmin, kmax, str(device)).passes(torch.float32).name)
        times = interleaved({name: timed(lambda f=f: (f() * c).sum().backward(), device)
                             for name, f in fwd.items()}, repeats=repeats, stat=STATS[stat])
        base = times["softmax + topk"]
        for name, f in fwd.items():
            mib = saved_bytes(f) / 2**20
            rows.append((label, name, f"{times[name] * 1e3:.2f}", f"{times[name] / base:.1f}x", f"{mib:.2f}"))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"\n{device.type}: {where}; T = {T} tokens; circuit passes: {', '.join(sorted(passes))}")
    print(table(rows, ("constraint", "routine", f"{stat} fwd+bwd (ms)", "ratio to softmax + topk",
                       "saved for backward (MiB)")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per call (default: 4096 on the CPU, 65536 on CUDA)")
    ap.add_argument("--sizes", default="64:8,64:4-8,128:8,256:16",
                    help="comma-separated N:k (exactly k of N) or N:a-b (a..b of N)")
    ap.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stat", choices=tuple(STATS), default="median",
                    help="the statistic of each routine's repeats: median, or min (the least disturbed run, "
                         "for a loaded machine)")
    ap.add_argument("--compiled", action="store_true",
                    help="also time route under torch.compile(fullgraph=True) (inductor; compiling takes minutes)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import circuits.passes

    from circuits.dp import c_dp

    dp_where = f"the fused C DP ({c_dp.describe()})" if c_dp.library() else f"the torch DP ({c_dp.describe()})"
    print(f"fp32, torch {torch.__version__}; fp32 CPU calls take the "
          f"{circuits.passes.describe()} and {dp_where}; load average {os.getloadavg()[0]:.2f} at start")
    for name in args.devices.split(","):
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"\n{name}: skipped (no CUDA device)")
            continue
        tokens = args.tokens or (65536 if device.type == "cuda" else 4096)
        bench_device(device, args.sizes.split(","), tokens, args.repeats, args.compiled, args.stat)
    print(f"\nload average {os.getloadavg()[0]:.2f} at end (the machine may be shared: compare ratios, not times)")


if __name__ == "__main__":
    main()
