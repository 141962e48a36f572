"""Benchmark one training step of an MoE language model per routing method (the paper's Fig. 7).

    python tools/bench_step.py [--tokens 2048] [--seq 256] [--hidden 128] [--experts 64] [--top-k 8]
                               [--layers 2] [--heads 4] [--vocab 512] [--dtype float32|bfloat16]
                               [--family olmoe|deepseek_v3 [--groups 8] [--topk-group 4]] [--expert-width W]
                               [--repeats 15] [--threads 2] [--devices cpu,cuda]
                               [--methods LABEL ...] [--json FILE [--append]]

An OLMoE-proportioned model scaled down for the CPU (64 experts, top-8; OLMoE-1B-7B has hidden
2048, 16 layers), randomly initialised, one copy per method from the same weights; with ``--family
deepseek_v3`` a DeepSeek-V3 model of the same widths (every layer MoE, one shared expert, MLA
attention) whose gate takes the top-k from ``--topk-group`` of ``--groups`` expert groups, timed
with its stock gate as conventional against ProbMoE grouped (``probmoe-grouped``: the compiled
circuit, or the group DP). A step is
forward with labels, backward and an AdamW update on ``--tokens`` tokens. For conventional
top-k, DenseMixer, ProbMoE Exact-k (the "dp" and the "circuit" backend), ProbMoE Dynamic-k
(1..top-k, circuit), DefaultMoE, SparseMixer and ReMoE (``--methods`` picks some): the median step time (interleaved repeats, so drift hits all alike), tokens
per second and peak memory, each as a ratio to conventional measured in the same run, and the
experts a token used on average. ``--router-offset c`` adds c to every router logit (through a
constant input feature of the router; the experts see the hidden states unchanged): softmax,
top-k, Exact-k and DenseMixer are shift invariant, so only Dynamic-k changes, and a negative c
makes its tokens use fewer experts, as a trained router can (c = -3 gives about 3 of 1..8).
ReMoE runs the experts whose ReLU gate is positive: about half of them with an untrained router
(its L1 penalty brings that to top-k only over training), so its row is read together with its
experts-per-token column, or with a negative offset that puts it near top-k. Peak memory is the peak resident set of a fresh process that
runs two steps (CPU; the whole process: torch, transformers and the model included) or, on
CUDA, the method's own parameters and AdamW state plus the most ``torch.cuda.max_memory_allocated``
rose above what was allocated before one step (every method's model lives on the GPU at once,
so the device's whole peak would count the others too). ``--dtype bfloat16`` keeps the
parameters and AdamW state in bf16 (the model computes in bf16); ``--no-memory`` leaves memory
out (NaN); ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import interleaved, table

METHODS = {  # label -> patch_model arguments (None: the stock model)
    "conventional": None,
    "DenseMixer": dict(method="densemixer"),
    "ProbMoE (dp)": dict(method="probmoe", backend="dp"),
    "ProbMoE (circuit)": dict(method="probmoe", backend="circuit"),
    "ProbMoE Dynamic-k (circuit)": dict(method="probmoe-dynamic", backend="circuit"),
    "DefaultMoE": dict(method="defaultmoe"),
    "SparseMixer": dict(method="sparsemixer"),
    "ReMoE": dict(method="remoe"),
    "ProbMoE grouped (circuit)": dict(method="probmoe-grouped", algorithm="circuit"),
    "ProbMoE grouped (dp)": dict(method="probmoe-grouped", algorithm="dp"),
}
GROUPED = ("ProbMoE grouped (circuit)", "ProbMoE grouped (dp)")  # --family deepseek_v3 only
FAMILIES = ("olmoe", "deepseek_v3")


def build(args, device: torch.device, labels=tuple(METHODS)) -> dict:
    """label -> (model, optimizer) for ``labels``, every model from the same initial weights."""
    from probmoe.integrations.transformers import patch_model
    from probmoe.integrations.transformers.testing import tiny_model

    expert_width = args.expert_width or args.hidden // 2
    widths = dict(
        hidden_size=args.hidden,
        intermediate_size=expert_width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        num_experts_per_tok=args.top_k,
        vocab_size=args.vocab,
        max_position_embeddings=args.seq,
    )
    if args.family == "deepseek_v3":  # every layer MoE, experts as wide as OLMoE's, the gate's groups
        widths.update(
            n_routed_experts=args.experts,
            moe_intermediate_size=expert_width,
            first_k_dense_replace=0,
            n_group=args.groups,
            topk_group=args.topk_group,
        )
    else:
        widths.update(num_experts=args.experts)
    base = tiny_model(args.family, seed=0, **widths).to(DTYPES[args.dtype])
    if args.router_offset:
        offset_routers(base, args.router_offset)
    out = {}
    for label in labels:
        patch = METHODS[label]
        model = copy.deepcopy(base).to(device).train()
        if patch is not None:
            patch_model(model, **patch)
        out[label] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    return out


def offset_routers(model, offset: float) -> None:
    """Add ``offset`` to every router logit: the router's input feature 0 is set to 1 (a forward
    pre-hook on the router, on a copy of its input) and its weight column 0 to ``offset``."""

    def constant_feature(_, args):
        h = args[0].clone()
        h[..., 0] = 1.0
        return (h, *args[1:])

    for layer in model.model.layers:
        gate = layer.mlp.gate  # OLMoE's router: logits = F.linear(h, weight) [T, N]
        with torch.no_grad():
            gate.weight[:, 0] = offset
        gate.register_forward_pre_hook(constant_feature)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def static_mib(model, opt) -> float:
    """MiB of ``model``'s parameters and buffers and ``opt``'s state tensors (what stays allocated
    between steps; the gradients are freed by ``zero_grad(set_to_none=True)``)."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for state in opt.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def step(model, opt, ids: torch.Tensor) -> None:
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def experts_per_token(model, top_k: int) -> float:
    """Mean experts per token over the layers in the last forward (the stock model: top_k)."""
    from probmoe.integrations.transformers import is_patched, router_stats

    if not is_patched(model):
        return float(top_k)
    counts = [s["experts_per_token"].float().mean().item() for s in router_stats(model)]
    return sum(counts) / len(counts)


def peak_rss_mib(args, label: str) -> float:
    """Peak resident set (MiB) of a fresh process that builds the ``label`` model and runs two steps."""
    code = "import sys, json; sys.argv = json.loads(sys.argv[1]); import bench_step; bench_step.rss_child()"
    argv = [
        sys.argv[0],
        *[
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k not in ("methods", "child", "json", "no_memory", "append")
        ],
        f"--child={label}",
    ]
    run = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argv)],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    return float(run.stdout.strip().splitlines()[-1])


def rss_child() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    model, opt = build(args, torch.device("cpu"), [args.child])[args.child]
    ids = torch.randint(3, args.vocab, (args.tokens // args.seq, args.seq))
    for _ in range(2):
        step(model, opt, ids)
    print(peak_resident_mib())


def peak_resident_mib() -> float:
    """This process's peak resident set in MiB: VmHWM, which starts afresh at exec (ru_maxrss
    carries the parent's peak across fork and exec on Linux)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc: the best there is


def bench(args, device: torch.device) -> list[dict]:
    """Time, tokens/s and peak memory per method on ``device``; print the table, return its rows."""
    models = build(args, device, ["conventional", *[m for m in args.methods if m != "conventional"]])
    ids = torch.randint(3, args.vocab, (args.tokens // args.seq, args.seq), device=device)

    def run(label):
        model, opt = models[label]
        if device.type == "cuda":
            return lambda: (step(model, opt, ids), torch.cuda.synchronize(device))
        return lambda: step(model, opt, ids)

    times = interleaved({label: run(label) for label in models}, repeats=args.repeats, warmup=2)
    memory = {}
    for label in models:
        if args.no_memory:
            memory[label] = float("nan")
        elif device.type == "cuda":
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            run(label)()
            rise = (torch.cuda.max_memory_allocated(device) - before) / 2**20
            memory[label] = static_mib(*models[label]) + rise
        else:
            memory[label] = peak_rss_mib(args, label)
    base_t, base_m = times["conventional"], memory["conventional"]
    rows, records = [], []
    for label, (model, _) in models.items():
        t = times[label]
        used = experts_per_token(model, args.top_k)
        rows.append(
            (
                label,
                f"{t * 1e3:.0f}",
                f"{t / base_t:.3f}x",
                f"{args.tokens / t:,.0f}",
                f"{memory[label]:.0f}",
                f"{memory[label] / base_m:.3f}x",
                f"{used:.2f}",
            )
        )
        measured = not args.no_memory
        records.append(
            dict(
                device=str(device),
                family=args.family,
                method=label,
                seconds=t,
                step_ratio=t / base_t,
                tokens_per_s=args.tokens / t,
                peak_mib=memory[label] if measured else None,
                memory_ratio=memory[label] / base_m if measured else None,
                experts_per_token=used,
            )
        )
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    groups = f", {args.topk_group} of {args.groups} groups" if args.family == "deepseek_v3" else ""
    print(
        f"\n{where}: {args.family}, {args.tokens} tokens per step ({args.tokens // args.seq} x {args.seq}), "
        f"hidden {args.hidden}, {args.layers} layers, {args.experts} experts, top-{args.top_k}{groups}, "
        f"{args.dtype}, router offset {args.router_offset:g}"
    )
    print(
        table(
            rows,
            (
                "method",
                "step (ms)",
                "step / conventional",
                "tokens/s",
                "peak memory (MiB)",
                "memory / conventional",
                "experts per token",
            ),
        )
    )
    return records


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--family",
        choices=FAMILIES,
        default="olmoe",
        help="olmoe (softmax top-k) or deepseek_v3 (sigmoid scores, top-k from --topk-group of --groups "
        "expert groups; its methods: conventional, the stock grouped gate, and ProbMoE grouped)",
    )
    ap.add_argument("--groups", type=int, default=8, help="deepseek_v3: expert groups (n_group)")
    ap.add_argument("--topk-group", type=int, default=4, help="deepseek_v3: groups a token may use (topk_group)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument(
        "--expert-width",
        type=int,
        default=0,
        help="an expert's intermediate size (default: hidden / 2; 256 experts of hidden / 8 weigh what 64 of hidden / 2 do)",
    )
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4, help="attention heads (and key/value heads)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default="float32",
        help="the parameters' and AdamW state's dtype (the model computes in it)",
    )
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--router-offset",
        type=float,
        default=0.0,
        help="add this to every router logit (negative: Dynamic-k tokens use fewer experts)",
    )
    ap.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--methods",
        nargs="+",
        choices=tuple(METHODS),
        default=None,
        help="the rows to measure (conventional, the baseline of the ratios, always; default: every "
        "method of --family, the grouped ones for deepseek_v3 only)",
    )
    ap.add_argument(
        "--no-memory",
        action="store_true",
        help="leave peak memory out (on the CPU it costs a fresh process per method)",
    )
    ap.add_argument("--json", help="also write the rows (method, seconds, ratios, peak memory) here")
    ap.add_argument(
        "--append",
        action="store_true",
        help="add the rows to --json's (one method per process: each run's conventional row is its own "
        "baseline; the file keeps the first)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse()
    if args.tokens % args.seq:
        raise SystemExit(f"--tokens ({args.tokens}) must be a multiple of --seq ({args.seq})")
    if args.methods is None:
        args.methods = (
            ["conventional", *GROUPED] if args.family == "deepseek_v3" else [m for m in METHODS if m not in GROUPED]
        )
    if args.family == "deepseek_v3" and (args.experts % args.groups or not 1 <= args.topk_group <= args.groups):
        raise SystemExit(
            f"--groups must divide --experts and 1 <= --topk-group <= --groups, got {args.experts} experts, "
            f"--groups {args.groups}, --topk-group {args.topk_group}"
        )
    wrong = [m for m in args.methods if m in GROUPED and args.family != "deepseek_v3"]
    if wrong:
        raise SystemExit(f"--methods {wrong[0]!r} routes within expert groups: it needs --family deepseek_v3")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f} at start")
    records, earlier = [], []
    if args.append and args.json and os.path.exists(args.json):
        with open(args.json) as f:
            earlier = json.load(f)["rows"]
    has_baseline = any(r["method"] == "conventional" for r in earlier)
    for name in args.devices.split(","):
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"\n{name}: skipped (no CUDA device)")
            continue
        records += bench(args, device)
        if args.json:
            rows = earlier + [r for r in records if not (r["method"] == "conventional" and has_baseline)]
            with open(args.json, "w") as f:
                json.dump(dict(settings={k: v for k, v in vars(args).items() if k != "child"}, rows=rows), f, indent=1)
    print(f"\nload average {os.getloadavg()[0]:.2f} at end (the machine may be shared: compare ratios, not times)")


if __name__ == "__main__":
    main()
