"""Benchmark Dynamic-k experts: skipping unused slots against computing all kmax slots.

    python tools/bench_dynamic_experts.py [--tokens 512] [--hidden 128] [--intermediate 256]
        [--experts 16] [--kmin 1] [--kmax 4] [--shift -1.5 0] [--repeats 7] [--threads 2]

A transformers Qwen3-MoE experts module (fused 3-D weights), fp32, CPU, under each experts
implementation ("eager", "grouped_mm", "batched_mm"). Routing: ``probmoe.route`` training draws
of Dynamic-k over kmin..kmax from logits N(shift, 1) (a lower shift gives smaller subsets). For
each implementation, the median time of experts forward + backward (interleaved repeats) with
the unused slots skipped (``probmoe.integrations.transformers``' patched experts) and with every
slot computed at weight 0 (what the official ProbMoE code and a plain index-with-weight-0 do),
and the (token, expert) rows each computes.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from timing import interleaved, table

import probmoe
from probmoe.integrations.transformers import experts as skipping


def experts_module(hidden: int, intermediate: int, n: int, impl: str):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=intermediate, num_experts=n)
    config._experts_implementation = impl
    module = Qwen3MoeExperts(config)
    with torch.no_grad():
        module.gate_up_proj.normal_(0, 0.02)
        module.down_proj.normal_(0, 0.02)
    return module


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--kmin", type=int, default=1)
    p.add_argument("--kmax", type=int, default=4)
    p.add_argument("--shift", type=float, nargs="+", default=[-1.5, 0.0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(a.tokens, a.hidden, generator=g)
    rows = []
    for shift in a.shift:
        logits = torch.randn(a.tokens, a.experts, generator=g) + shift
        routing = probmoe.route(logits, kmin=a.kmin, kmax=a.kmax, training=True, generator=g)
        idx, w = routing.indices, routing.weights.detach()
        active = int(routing.counts.sum())
        for impl in ("eager", "grouped_mm", "batched_mm"):
            full = experts_module(a.hidden, a.intermediate, a.experts, impl)
            skip = experts_module(a.hidden, a.intermediate, a.experts, impl)
            skip.load_state_dict(full.state_dict())
            skipping.install(skip)
            x_full, x_skip = h.clone().requires_grad_(), h.clone().requires_grad_()
            torch.testing.assert_close(skip(x_skip, idx, w), full(x_full, idx, w), atol=1e-5, rtol=1e-4)

            def step(module, x):
                def run():
                    module.zero_grad(set_to_none=True)
                    x.grad = None
                    module(x, idx, w).square().sum().backward()

                return run

            t = interleaved({"skip": step(skip, x_skip), "full": step(full, x_full)}, repeats=a.repeats)
            rows.append(
                (
                    shift,
                    f"{active / a.tokens:.2f}",
                    impl,
                    active,
                    idx.numel(),
                    f"{active / idx.numel():.2f}",
                    f"{t['skip'] * 1e3:.1f}",
                    f"{t['full'] * 1e3:.1f}",
                    f"{t['skip'] / t['full']:.2f}",
                )
            )
    print(
        f"T={a.tokens}, D={a.hidden}, I={a.intermediate}, N={a.experts}, k in [{a.kmin}, {a.kmax}], fp32, "
        f"{a.threads} threads, forward + backward, median of {a.repeats}"
    )
    print(
        table(
            rows,
            (
                "logit shift",
                "experts/token",
                "implementation",
                "rows skip",
                "rows all kmax",
                "row ratio",
                "skip ms",
                "all-kmax ms",
                "time ratio",
            ),
        )
    )


if __name__ == "__main__":
    main()
