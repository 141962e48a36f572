"""Benchmark route(training=True) forward + backward against softmax + topk, in the same run.

    python tools/bench_router.py [--tokens T] [--sizes 64:8,64:4-8,256:8/8g4] [--devices cpu,cuda]
                                 [--dtypes fp32,bf16] [--passes auto|torch,triton,...]
                                 [--repeats 15] [--threads 2] [--compiled] [--stat median|min]
                                 [--json FILE]

For each device (default: the CPU at T = 4096 tokens, and CUDA at T = 65,536 when there is one;
``--tokens`` sets both), each logits dtype (``--dtypes``, default fp32) and each constraint (N:k
for exactly k of N experts, N:a-b for a..b, N:k/GgM for k of N from at most M of G groups, the
group-limited constraint of DeepSeek-V3's gate: route dp is then the group DP): the median time of route(training=True) forward +
backward (to the logits) for each backend as a ratio to softmax + topk forward + backward on the
same device and dtype (interleaved repeats, so drift hits all alike), and the bytes the autograd
graph keeps for the backward (distinct storages seen by ``torch.autograd.graph.saved_tensors_hooks``);
with ``--compiled`` also each backend under torch.compile(fullgraph=True). ``--passes torch,triton``
times the circuit backend once per named implementation of its float32 passes (default "auto":
the one ``circuits.kernels.select.select`` picks; triton on CUDA only), side by side with the DP. Each
table says which circuit passes ran on that device; ``--json`` also writes every row to FILE.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import interleaved, table

import circuits
import circuits.kernels.select
import probmoe
from probmoe import constraints

STATS = {"median": statistics.median, "min": min}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
    """'64:8' -> ('exactly 8 of 64', 64, {k: 8}); '64:4-8' -> ('range 4..8 of 64', 64, {kmin: 4, kmax: 8});
    '256:8/8g4' -> ('8 of 256 in <= 4 of 8 groups', 256, {constraint: GroupLimited(256, 8, 8, 4)})
    (DeepSeek-V3's gate)."""
    n, _, k = text.partition(":")
    if "/" in k:
        k, _, groups = k.partition("/")
        g, _, m = groups.partition("g")
        spec = circuits.GroupLimited(int(n), int(k), int(g), int(m))
        return f"{k} of {n} in <= {m} of {g} groups", int(n), dict(constraint=spec)
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
    return torch.compile(lambda x: probmoe.route(x, **size, training=True, algorithm=backend).weights, fullgraph=True)


@contextlib.contextmanager
def circuit_passes_of(circuit, passes):
    """Within the block, ``circuit``'s float32 calls take ``passes`` (made once by
    ``circuits.kernels.select.select(program, float32, prefer=...)``). The circuit keeps the passes it
    picked per dtype (``Circuit.passes``); this swaps that entry and puts it back."""
    before = circuit.kernels(torch.float32)
    circuit._kernels[torch.float32] = passes
    try:
        yield passes
    finally:
        circuit._kernels[torch.float32] = before


def implementations(device: torch.device, wanted: list[str]) -> list[str]:
    """The circuit passes to time on ``device``: those of ``wanted`` that run there ("c" on the CPU,
    "triton" on CUDA; "torch" and "auto" anywhere)."""
    runs = {"auto", "torch", "c" if device.type == "cpu" else "triton"}
    return [w for w in wanted if w in runs]


def bench_device(
    device: torch.device,
    sizes: list[str],
    T: int,
    repeats: int,
    compiled: bool = False,
    stat: str = "median",
    dtype: torch.dtype = torch.float32,
    passes_wanted=("auto",),
) -> list[dict]:
    """Time every routine for each constraint in ``sizes`` on logits r [T, N] of ``dtype``; print one
    table and return its rows as dicts."""
    gen = torch.Generator(device=device).manual_seed(0)
    rows, records, names = [], [], set()
    for text in sizes:
        label, N, size = parse_size(text)
        spec = size.get("constraint")
        kmax = spec.kmax if spec else size.get("k", size.get("kmax"))
        kmin = spec.kmin if spec else size.get("k", size.get("kmin"))
        r = (torch.randn(T, N, generator=gen, device=device) * 2).to(dtype).requires_grad_()
        c = torch.randn(T, kmax, generator=gen, device=device, dtype=dtype)
        # route's own circuit: keyed by "cuda:0", not "cuda"
        circuit = constraints.compiled(spec, r.device) if spec else constraints.cardinality(N, kmin, kmax, r.device)
        fwd = {"softmax + topk": lambda: softmax_topk(r, kmax)}
        for impl in ["dp", *implementations(device, list(passes_wanted))]:
            backend = "dp" if impl == "dp" else "circuit"
            name = "route dp" if impl == "dp" else f"route circuit ({impl})" if impl != "auto" else "route circuit"
            route = lambda b: lambda: probmoe.route(r, **size, training=True, algorithm=b, generator=gen).weights
            if impl in ("dp", "auto"):
                fwd[name] = route(backend)
            else:  # the circuit's float32 passes swapped for this routine's calls only
                chosen = circuits.kernels.select.select(circuit.program, torch.float32, prefer=impl)
                fwd[name] = (lambda p, f: lambda: _with(circuit, p, f))(chosen, route(backend))
            if compiled and impl in ("dp", "auto"):
                fn = compiled_route(size, backend)
                fn(r)  # compile outside the timed runs
                fwd[f"{name} compiled"] = (lambda g: lambda: g(r))(fn)
        names.add(circuit.kernels(torch.float32).name)
        times = interleaved(
            {name: timed(lambda f=f: (f() * c).sum().backward(), device) for name, f in fwd.items()},
            repeats=repeats,
            stat=STATS[stat],
        )
        base = times["softmax + topk"]
        for name, f in fwd.items():
            mib = saved_bytes(f) / 2**20
            rows.append((label, name, f"{times[name] * 1e3:.2f}", f"{times[name] / base:.2f}x", f"{mib:.2f}"))
            records.append(
                dict(
                    device=str(device),
                    dtype=str(dtype).removeprefix("torch."),
                    tokens=T,
                    constraint=label,
                    routine=name,
                    seconds=times[name],
                    ratio=times[name] / base,
                    saved_mib=mib,
                )
            )
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"\n{device.type}: {where}; {str(dtype).removeprefix('torch.')} logits; T = {T} tokens; "
        f"circuit passes picked: {', '.join(sorted(names))}"
    )
    print(
        table(
            rows,
            ("constraint", "routine", f"{stat} fwd+bwd (ms)", "ratio to softmax + topk", "saved for backward (MiB)"),
        )
    )
    return records


def _with(circuit, passes, fn):
    """``fn()`` with ``circuit``'s float32 calls on ``passes``."""
    with circuit_passes_of(circuit, passes):
        return fn()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tokens", type=int, default=None, help="tokens per call (default: 4096 on the CPU, 65536 on CUDA)"
    )
    ap.add_argument(
        "--sizes",
        default="64:8,64:4-8,128:8,256:16",
        help="comma-separated N:k (exactly k of N), N:a-b (a..b of N) or N:k/GgM (k of N in at most M of G groups)",
    )
    ap.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--stat",
        choices=tuple(STATS),
        default="median",
        help="the statistic of each routine's repeats: median, or min (the least disturbed run, for a loaded machine)",
    )
    ap.add_argument(
        "--compiled",
        action="store_true",
        help="also time route under torch.compile(fullgraph=True) (inductor; compiling takes minutes)",
    )
    ap.add_argument("--dtypes", default="fp32", help=f"comma-separated logits dtypes, of {', '.join(DTYPES)}")
    ap.add_argument(
        "--passes",
        default="auto",
        help="comma-separated circuit pass implementations to time: auto (select's pick), torch, c (CPU), "
        "triton (CUDA); those that do not run on a device are left out there",
    )
    ap.add_argument("--json", help="also write every row (device, dtype, constraint, routine, seconds, ratio) here")
    args = ap.parse_args()
    for text in args.sizes.split(","):
        try:
            parse_size(text)
        except ValueError as exc:  # not numbers, or a group spec out of range
            ap.error(f"--sizes: {text!r} is not N:k, N:a-b or N:k/GgM ({exc})")
    dtypes = args.dtypes.split(",")
    if bad := [d for d in dtypes if d not in DTYPES]:
        ap.error(f"--dtypes: {', '.join(bad)} not one of {', '.join(DTYPES)}")
    wanted = args.passes.split(",")
    if bad := [p for p in wanted if p not in ("auto", "torch", "c", "triton")]:
        ap.error(f"--passes: {', '.join(bad)} not one of auto, torch, c, triton")
    torch.set_num_threads(args.threads)
    from circuits.kernels import library

    where = library.describe()
    dp_where = f"the fused C DP ({where})" if library.library() else f"the torch DP ({where})"
    print(
        f"fp32, torch {torch.__version__}; fp32 CPU calls take the "
        f"{circuits.kernels.select.describe()} and {dp_where}; load average {os.getloadavg()[0]:.2f} at start"
    )
    records = []
    for name in args.devices.split(","):
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"\n{name}: skipped (no CUDA device)")
            continue
        tokens = args.tokens or (65536 if device.type == "cuda" else 4096)
        for dtype in dtypes:
            records += bench_device(
                device, args.sizes.split(","), tokens, args.repeats, args.compiled, args.stat, DTYPES[dtype], wanted
            )
            if args.json:  # after each table: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(records, f, indent=1)
    print(f"\nload average {os.getloadavg()[0]:.2f} at end (the machine may be shared: compare ratios, not times)")


if __name__ == "__main__":
    main()
