"""Where the time of a training route goes: route(training=True, backend=...) forward + backward
beside softmax + top-k, split into the host's time, the device's kernels and the wall.

    python tools/profile_route.py [--device cuda] [--tokens 65536] [--sizes 64:8,256:16]
                                  [--backends dp,circuit] [--dtype fp32|bf16] [--repeats 20] [--json FILE]

For each constraint (N:k, N:a-b as in tools/bench_router.py) and each routine, with the logits
r [T, N] and an upstream gradient c [T, kmax] made once:

- wall, one call: the call then a synchronisation (what bench_router.py times);
- wall, queued: ``--repeats`` calls back to back, one synchronisation, per call (the host runs ahead
  of the device when the kernels are the longer part: this is the larger of the two);
- host: the Python and dispatch time of one call, measured with the profiler's CPU events;
- kernels: the device time of the call's kernels (the profiler's CUDA events, summed), with the
  kernels that take it, each with its launches per call;
- graph (CUDA): the call captured once in a CUDA graph and replayed (no host work per call; what a
  model compiled with mode="reduce-overhead" pays), or why capture failed.

Ratios are to softmax + top-k in the same run, column by column. On the CPU (the device check's
rehearsal) there are no kernels nor graphs: host and wall only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))  # report's table
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_router import DTYPES, parse_size, softmax_topk
from report import profile_table
from timing import table

import probmoe


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_one(fn, device, repeats: int) -> float:
    """Median seconds of one call followed by a synchronisation."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def wall_queued(fn, device, repeats: int) -> float:
    """Seconds per call of ``repeats`` calls issued back to back, one synchronisation at the end."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / repeats


def profiled(fn, device, repeats: int) -> tuple[float, float, list[tuple[str, float, float]]]:
    """(host seconds of the median call, kernel seconds per call, [(kernel, seconds per call, launches per
    call)] longest first) from the profiler over ``repeats`` calls."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=acts) as prof:
        for _ in range(repeats):
            with torch.profiler.record_function("call"):
                fn()
        _sync(device)
    events = prof.events()
    host = statistics.median(e.cpu_time_total for e in events if e.name == "call" and e.device_type == DeviceType.CPU)
    kernels: dict[str, list[float]] = {}
    for e in events:
        if e.device_type == DeviceType.CUDA and e.name != "call":  # the range's own device-side copy
            kernels.setdefault(e.name, []).append(e.device_time_total / 1e6)
    rows = sorted(((name[:60], sum(t) / repeats, len(t) / repeats) for name, t in kernels.items()), key=lambda x: -x[1])
    return host / 1e6, sum(r[1] for r in rows), rows


def graphed(fn, device, repeats: int) -> tuple[float | None, str]:
    """(seconds per replay of ``fn`` captured in a CUDA graph, "") or (None, why it was not)."""
    if device.type != "cuda":
        return None, "no CUDA graphs on the CPU"
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(3):
            graph.replay()
        return wall_queued(graph.replay, device, repeats), ""
    except Exception as e:  # a capture that fails is a finding, reported, not a crash of the profile
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def measure(
    size_text: str, T: int, device: torch.device, dtype: torch.dtype, repeats: int, backends: list[str]
) -> dict:
    """Every column for softmax + top-k and the route on each of ``backends`` at one constraint."""
    label, N, size = parse_size(size_text)
    kmax = size.get("k", size.get("kmax"))
    gen = torch.Generator(device=device).manual_seed(0)
    r = (torch.randn(T, N, generator=gen, device=device) * 2).to(dtype).requires_grad_()
    c = torch.randn(T, kmax, generator=gen, device=device, dtype=dtype)

    def baseline():
        r.grad = None
        (softmax_topk(r, kmax) * c).sum().backward()

    def route(backend: str):
        def call():
            r.grad = None
            (probmoe.route(r, **size, training=True, algorithm=backend).weights * c).sum().backward()

        return call

    out = {"constraint": label, "tokens": T, "dtype": str(dtype).removeprefix("torch."), "routines": {}}
    for name, fn in (("softmax + topk", baseline), *((f"route {b}", route(b)) for b in backends)):
        for _ in range(3):  # compile, warm the caches and the allocator
            fn()
        host, kernel, kernels = profiled(fn, device, repeats)
        graph, why = graphed(fn, device, repeats)
        out["routines"][name] = dict(
            wall_one=wall_one(fn, device, repeats),
            wall_queued=wall_queued(fn, device, repeats),
            host=host,
            kernels=kernel if device.type == "cuda" else None,
            graph=graph,
            graph_failed=why,
            kernel_list=kernels,
        )
    return out


def report(results: list[dict], where: str) -> str:
    """Markdown: per constraint, each routine's columns in ms and as ratios to softmax + top-k (the
    device check's report's table); then the routes' kernels."""
    text = [f"{where}; ms per forward + backward (ratio to softmax + top-k)", *profile_table(results)]
    routes = ((res["constraint"], name, m) for res in results for name, m in list(res["routines"].items())[1:])
    for constraint, name, m in routes:
        if m["graph_failed"] and m["kernel_list"]:
            text.append(f"{constraint}, {name}: CUDA graph capture failed: {m['graph_failed']}")
        if m["kernel_list"]:
            text.append(f"\n{constraint}, {name}'s kernels")
            text.append(
                table(
                    [(k, f"{s * 1e6:.1f}", f"{n:g}") for k, s, n in m["kernel_list"]],
                    ("kernel", "µs per call", "launches per call"),
                )
            )
    return "\n".join(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per call (default 65536 on CUDA, 1024 on the CPU)")
    ap.add_argument("--sizes", default="64:8,64:4-8,128:8,256:16", help="comma-separated N:k or N:a-b")
    ap.add_argument("--backends", default="dp", help="comma-separated exact algorithms of the route: dp, circuit")
    ap.add_argument("--dtype", default="fp32", choices=tuple(DTYPES))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", help="also write the measurements here")
    args = ap.parse_args()
    backends = args.backends.split(",")
    if bad := [b for b in backends if b not in ("dp", "circuit")]:
        ap.error(f"--backends: {', '.join(bad)} not one of dp, circuit")
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        ap.error(f"--device must be a torch device such as cpu or cuda, got {args.device!r}")
    if device.type not in ("cpu", "cuda"):
        ap.error(f"--device must be cpu or cuda, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    T = args.tokens if args.tokens is not None else 65536 if device.type == "cuda" else 1024
    if T < 1:
        ap.error(f"--tokens must be at least 1, got {T}")
    for size in args.sizes.split(","):
        try:
            _, n, ks = parse_size(size)
        except ValueError:
            ap.error(f"--sizes: {size!r} is not N:k or N:a-b with whole numbers")
        lo, hi = ks.get("k", ks.get("kmin")), ks.get("k", ks.get("kmax"))
        if not 1 <= lo <= hi <= n:
            ap.error(f"--sizes: {size!r} needs 1 <= k <= N (1 <= a <= b <= N for a range)")
    results = []
    for size in args.sizes.split(","):
        results.append(measure(size, T, device, DTYPES[args.dtype], args.repeats, backends))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(report(results, f"{where}, torch {torch.__version__}, T = {T}, {args.dtype} logits"))


if __name__ == "__main__":
    main()
