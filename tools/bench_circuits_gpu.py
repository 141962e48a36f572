"""The circuit path on CUDA (issue 46): the layer-parallel Triton passes against softmax + top-k and PyJuice.

    python tools/bench_circuits_gpu.py [--tokens 65536] [--sizes 64:8,64:4-8,256:16]
                                       [--cnf tests/data/satlib/ais6.cnf,...] [--rows 65536]
                                       [--repeats 10] [--json FILE] [--rehearse]
    python tools/bench_circuits_gpu.py --estimate | --registers

1. Routing: route(training=True) forward + backward (to the logits) with the circuit backend on the
   Triton passes (``circuits.passes.select(..., prefer="triton")``), as a ratio to softmax + top-k
   forward + backward in the same run (interleaved repeats: ``tools/timing.py``), for each N:k (exactly
   k of N) or N:a-b (a..b of N) of ``--sizes``.
2. log Z + marginals of ``--rows`` rows for the compiled circuits of ``--cnf`` (d4, the cnf extra) and of
   the first size: the Triton passes' float32 pass (``log_partition(r, True, accurate=False,
   refine=False)``: one upward and one downward pass), and PyJuice on the same DAG (built node by node
   through its API: an element is a product node, a decision node a sum node with weights 1, a
   literal one state of a two-state ``SoftEvidenceIndicator`` input taking log sigma(+-r) per row,
   implicit variables smoothed by a sum over both states) when ``pyjuice`` imports; else one line
   saying it is skipped.
3. ``--estimate`` (alone): the device-memory traffic of a training route's two passes per circuit, by a
   stated model (``traffic``), and the time it takes at 3 TB/s: an estimate, not a measurement.
4. ``--registers`` (alone): registers and spills of every kernel specialisation compiled for sm_90
   (``circuits.kernels.triton_layers_compile``; no GPU needed).

``--rehearse`` runs it all on the CPU at tiny sizes in Triton's interpreter (TRITON_INTERPRET=1 is set
before triton loads), so the script is proven before a device exists; its times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

if "--rehearse" in sys.argv:  # before anything imports triton: the interpreter, on CPU tensors
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_router import circuit_passes_of, parse_size, softmax_topk
from timing import interleaved, table

import circuits
import probmoe
from probmoe import constraints

HERE = os.path.dirname(os.path.abspath(__file__))
SATLIB = os.path.join(os.path.dirname(HERE), "tests", "data", "satlib")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_routes(device, sizes, T, repeats) -> list[dict]:
    """Part 1: route forward + backward, circuit backend on the Triton passes, over softmax + top-k."""
    gen = torch.Generator(device=device).manual_seed(0)
    rows, out = [], []
    for text in sizes:
        label, N, size = parse_size(text)
        kmax, kmin = size.get("k", size.get("kmax")), size.get("k", size.get("kmin"))
        r = (torch.randn(T, N, generator=gen, device=device) * 2).requires_grad_()
        c = torch.randn(T, kmax, generator=gen, device=device)
        circuit = constraints.cardinality(N, kmin, kmax, r.device)
        fast = circuits.passes.select(circuit.program, torch.float32, prefer="triton")

        def route():
            with circuit_passes_of(circuit, fast):
                return probmoe.route(r, **size, training=True, algorithm="circuit", generator=gen).weights

        fns = {"softmax + topk": lambda: softmax_topk(r, kmax), "route circuit (triton)": route}
        times = interleaved(
            {k: (lambda f=f: ((f() * c).sum().backward(), sync(device))) for k, f in fns.items()}, repeats=repeats
        )
        base = times["softmax + topk"]
        for name, s in times.items():
            rows.append((label, name, f"{s * 1e3:.3f}", f"{s / base:.2f}x"))
            out.append(dict(part="route", constraint=label, routine=name, tokens=T, seconds=s, ratio=s / base))
    print(f"\nroute(training=True) forward + backward, T = {T}, fp32 logits")
    print(table(rows, ("constraint", "routine", "median fwd+bwd (ms)", "ratio to softmax + topk")))
    return out


# -- PyJuice -----------------------------------------------------------------------------------------


def pyjuice_circuit(prog, juice):
    """The DAG of ``prog`` (a ``Program``) through PyJuice's API: (compiled TensorCircuit, n). Products
    for elements (padding dropped, TRUE children left out), sums of weight 1 for decision nodes, a
    two-state soft-evidence input per variable (state 1: x_i), implicit variables smoothed by a sum over
    both states of their input."""
    import pyjuice.nodes.distributions as dists

    n = prog.n
    inputs = [
        juice.inputs(i, num_nodes=2, block_size=1, dist=dists.SoftEvidenceIndicator(num_states=2)) for i in range(n)
    ]
    both = {}

    def true_of(var):
        if var not in both:
            both[var] = juice.summate(
                inputs[var], num_nodes=1, block_size=1, edge_ids=torch.tensor([[0, 0], [0, 1]]), params=torch.ones(2)
            )
        return both[var], 0

    handle = {}
    for i in range(n):
        handle[2 + i], handle[2 + n + i] = (inputs[i], 1), (inputs[i], 0)
    prime, sub = prog.prime.tolist(), prog.sub.tolist()
    implicit: dict[int, list[int]] = {}
    for row, var in zip(prog.implicit_row.tolist(), prog.implicit_var.tolist()):
        implicit.setdefault(row, []).append(var)
    for g in prog.groups:
        for j in range(g.nodes):
            prods = []
            for e in range(g.rows.start + j * g.fanin, g.rows.start + (j + 1) * g.fanin):
                if prime[e] == 0:  # padding (FALSE)
                    continue
                kids = [handle[x] for x in (prime[e], sub[e]) if x != 1] + [true_of(v) for v in implicit.get(e, [])]
                prods.append(
                    juice.multiply(
                        *[k[0] for k in kids], edge_ids=torch.tensor([[k[1] for k in kids]]), sparse_edges=True
                    )
                )
            F = len(prods)
            handle[g.start + j] = (
                juice.summate(
                    *prods,
                    num_nodes=1,
                    block_size=1,
                    edge_ids=torch.tensor([[0] * F, list(range(F))]),
                    params=torch.ones(F),
                ),
                0,
            )
    root = handle[prog.num_slots - 1][0]
    return juice.compile(root), n


def _too_long(signum, frame):
    raise TimeoutError("building the PyJuice circuit took too long")


def bench_log_z(device, programs: dict, rows: int, repeats: int, build_limit: int = 120) -> list[dict]:
    """Part 2: log Z + marginals of ``rows`` rows, the Triton passes' fp32 pass and PyJuice's (its build
    and compile stopped after ``build_limit`` seconds)."""
    try:
        import pyjuice as juice
    except Exception as e:  # ImportError, or a dependency that fails to load
        juice = None
        print(f"\nPyJuice: skipped ({type(e).__name__}: {e}); pip install pyjuice (and numba) to compare")
    table_rows, out = [], []
    gen = torch.Generator(device=device).manual_seed(1)
    for name, prog in programs.items():
        r = torch.randn(rows, prog.n, generator=gen, device=device) * 2
        fast = circuits.passes.select(prog, torch.float32, prefer="triton")
        fns = {"triton passes": lambda fast=fast, r=r: fast.log_partition(r, True, accurate=False, refine=False)}
        if juice is not None:
            try:
                t0 = time.perf_counter()
                signal.signal(signal.SIGALRM, _too_long)
                signal.alarm(build_limit)  # building node by node in Python: bounded
                try:
                    pc, n = pyjuice_circuit(prog, juice)
                    pc.to(device)
                finally:
                    signal.alarm(0)
                build = time.perf_counter() - t0
                data = torch.zeros(rows, n, dtype=torch.long, device=device)
                ev = torch.stack([torch.nn.functional.logsigmoid(-r), torch.nn.functional.logsigmoid(r)], dim=2)
                grad = torch.zeros_like(ev)

                def pyjuice_pass(pc=pc, data=data, ev=ev, grad=grad):
                    lls = pc(data, indicator_evidence_logp=ev)
                    pc.backward(
                        data,
                        allow_modify_flows=False,
                        logspace_flows=True,
                        indicator_evidence_logp=ev,
                        indicator_evidence_logp_grad=grad,
                    )
                    return lls

                lls = pyjuice_pass()
                mine = fast.log_partition(r, False, accurate=False, refine=False)[0]
                err = (lls.view(-1).double() - mine.double()).abs().max().item()
                print(f"PyJuice on {name}: built and compiled in {build:.1f} s; |log Z - ours| <= {err:.2e}")
                fns["pyjuice"] = pyjuice_pass
            except Exception as e:  # the comparison is optional: say why and go on
                print(f"PyJuice on {name}: failed ({type(e).__name__}: {str(e)[:300]})")
        times = interleaved({k: (lambda f=f: (f(), sync(device))) for k, f in fns.items()}, repeats=repeats)
        s = prog.num_slots, prog.num_rows
        for routine, t in times.items():
            ratio = t / times["pyjuice"] if "pyjuice" in times else float("nan")
            table_rows.append((name, f"{s[0]} / {s[1]}", routine, f"{t * 1e3:.3f}", f"{ratio:.2f}x"))
            out.append(
                dict(part="log_z", circuit=name, routine=routine, rows=rows, seconds=t, slots=s[0], elements=s[1])
            )
    print(f"\nlog Z + marginals, {rows} rows, fp32")
    print(table(table_rows, ("circuit", "slots / elements", "routine", "median (ms)", "ratio to pyjuice")))
    return out


def traffic(prog) -> dict:
    """The model of ``--estimate``: 4-byte accesses per token to device memory of one sampling pass and one
    Cov(z) v pass (docs/performance.md, "The circuit path on CUDA"). A level's launch reads each distinct
    child row once (programs that run together share a token tile, so repeats come from L2); an element's
    weight is written once (its first write, the log-value, stays in L2 until the weight overwrites it);
    every row a launch of another level wrote is read from memory."""
    import numpy as np

    from circuits.kernels.triton_passes import build_tables

    tb = build_tables(prog, 4)
    S, R, n = prog.num_slots, prog.num_rows, prog.n
    nodes = S - 2 - 2 * n
    prime, sub = prog.prime.cpu().numpy(), prog.sub.cpu().numpy()
    row0, fanin, order = tb.row0.cpu().numpy(), tb.fanin.cpu().numpy(), tb.order.cpu().numpy()
    tiles = tb.tiles.cpu().numpy()
    children = 0  # distinct child rows gathered, summed over levels
    for t0, count in tb.up:
        first, last = tiles[t0][0], tiles[t0 + count - 1][0] + tiles[t0 + count - 1][1]
        rows = np.concatenate([np.arange(row0[s], row0[s] + fanin[s]) for s in order[first:last]])
        children += len(np.unique(np.concatenate([prime[rows], sub[rows]])))
    leaves = 2 * n + n  # leaf rows written, logits read
    sample = leaves + (children + R + 2 * nodes) + (R + R + 2 * R + 2 * nodes) + 2 * n
    jvp = 2 * leaves + (2 * children + 2 * R + 3 * nodes) + (2 * R + 2 * R + 4 * R + 2 * nodes) + 3 * n
    levels = len(tb.up)
    return dict(slots=S, elements=R, levels=levels, launches=2 * (2 * levels + 2), sample=sample, jvp=jvp)


def estimate(programs: dict, T: int, bandwidth: float = 3.0e12) -> list[dict]:
    """``--estimate``: the bytes of the two passes of a training route (``traffic``) at ``bandwidth``."""
    rows, out = [], []
    for name, prog in programs.items():
        t = traffic(prog)
        gb = (t["sample"] + t["jvp"]) * 4 * T / 1e9
        rows.append(
            (
                name,
                t["slots"],
                t["elements"],
                t["levels"],
                t["sample"],
                t["jvp"],
                f"{gb:.2f}",
                f"{gb / bandwidth * 1e12:.2f}",
            )
        )
        out.append(dict(part="estimate", circuit=name, tokens=T, gigabytes=gb, **t))
    print(f"\nestimate (not a measurement): 4-byte accesses per token, T = {T}, at {bandwidth / 1e12:.1f} TB/s")
    print(table(rows, ("circuit", "slots", "elements", "levels", "sample pass", "Cov(z) v pass", "GB", "ms")))
    return out


def registers() -> list[dict]:
    """Part 3: registers and spills of every specialisation compiled for sm_90 (no device needed)."""
    from circuits.kernels.triton_layers_compile import compile_all

    rows = compile_all(90)
    print("\nthe kernels compiled for sm_90 (BN = 4 nodes x BT = 128 tokens, 4 warps, the passes' tiles; ptxas -v)")
    print(
        table(
            [(r["kernel"], r["registers"], r["spill_stores"], r["spill_loads"], r["stack"]) for r in rows],
            ("kernel", "registers", "spill stores (B)", "spill loads (B)", "stack (B)"),
        )
    )
    return [dict(part="registers", **r) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=None, help="route tokens (default 65536; 40 with --rehearse)")
    ap.add_argument("--sizes", default=None, help="N:k or N:a-b, comma-separated (default 64:8,64:4-8,256:16)")
    ap.add_argument(
        "--cnf",
        default=None,
        help="DIMACS files compiled by d4 for part 2, comma-separated ('' for none; default: SATLIB's ais6, flat30-2)",
    )
    ap.add_argument("--rows", type=int, default=None, help="rows of part 2 (default 65536; 40 with --rehearse)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 10; 1 with --rehearse)")
    ap.add_argument(
        "--registers", action="store_true", help="only compile every kernel for sm_90 and report registers (no device)"
    )
    ap.add_argument(
        "--estimate", action="store_true", help="only print the byte model of the passes (no device, no interpreter)"
    )
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--rehearse", action="store_true", help="the CPU in Triton's interpreter at tiny sizes")
    args = ap.parse_args()
    rehearse = args.rehearse
    if args.estimate:
        sizes = (args.sizes or "64:8,64:4-8,256:16").split(",")
        programs = {}
        for text in sizes:
            _, N, size = parse_size(text)
            kmin, kmax = size.get("k", size.get("kmin")), size.get("k", size.get("kmax"))
            programs[text] = constraints.cardinality(N, kmin, kmax, "cpu").program
        for path in cnf_files(args.cnf):
            programs[os.path.basename(path)] = circuits.compile_circuit(path).program
        save(args.json, estimate(programs, args.tokens or 65536))
        return
    if args.registers:
        save(args.json, registers())
        return
    if not rehearse and not torch.cuda.is_available():
        ap.error("no CUDA device: run with --rehearse for the CPU rehearsal")
    device = torch.device("cpu" if rehearse else "cuda")
    tokens = args.tokens or (40 if rehearse else 65536)
    rows = args.rows or (40 if rehearse else 65536)
    repeats = args.repeats or (1 if rehearse else 10)
    sizes = (args.sizes or ("16:4,12:3-5" if rehearse else "64:8,64:4-8,256:16")).split(",")
    cnfs = cnf_files(args.cnf)
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else "CPU (Triton's interpreter: times mean nothing)"
    )
    import triton

    print(f"{where}; torch {torch.__version__}, triton {triton.__version__}")
    records = bench_routes(device, sizes, tokens, repeats)
    save(args.json, records)
    programs = {}
    _, N, size = parse_size(sizes[0])
    programs[sizes[0]] = constraints.cardinality(
        N, size.get("k", size.get("kmin")), size.get("k", size.get("kmax")), device
    ).program
    for path in cnfs:
        try:
            programs[os.path.basename(path)] = circuits.compile_circuit(path, device=device).program
        except ImportError as e:  # d4 (the cnf extra) missing
            print(f"{path}: skipped ({e})")
    records += bench_log_z(device, programs, rows, repeats)
    save(args.json, records)


def cnf_files(arg: str | None) -> list[str]:
    """``--cnf``: the files it names (an empty string: none), else SATLIB's ais6 and flat30-2."""
    if arg is None:
        return [os.path.join(SATLIB, f) for f in ("ais6.cnf", "flat30-2.cnf")]
    return [p for p in arg.split(",") if p]


def save(path: str | None, records: list[dict]) -> None:
    """Every row so far into ``path`` (after each part: a run cut short keeps what it measured)."""
    if path:
        with open(path, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
