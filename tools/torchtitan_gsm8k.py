"""A tiny torchtitan MoE model (its Qwen3-MoE blocks, shrunk) trained on GSM8K with ProbMoE routing
under 2-rank expert parallelism on the CPU (gloo), with a checkpoint saved and resumed bit for bit.

    torchrun --standalone --nproc-per-node 2 tools/torchtitan_gsm8k.py \\
        --data ../shared/data/gsm8k/train.jsonl --steps 300 --save-at 150 --out runs/tt-gsm8k

torchtitan's trainer does not run without CUDA (0.3.0 takes the device type "cuda" when no
accelerator is present; its flex attention has no CPU backward), so this is the smallest honest
loop around torchtitan's model and its EP plan: the model is torchtitan's (``Qwen3Model`` from its
``_build_qwen3_moe_layers``, 2 layers, dim 64, 8 experts), routed by ``ProbMoERouter`` (Dynamic-k
``--kmin``..``--top-k``, a per-rank seed), with SDPA causal attention in place of flex attention;
its experts sharded over the ranks with torchtitan's own plan (``Module.parallelize``, all-to-all
token exchange). The dense parameters are data-parallel by an all-reduce of their gradients (FSDP2
with EP is exercised in tests/integrations/test_torchtitan_ep.py); AdamW; byte-level tokens, one
problem per row (question, answer), padded to ``--seq-len``, each rank reading its own rows.
What only torchtitan's trainer adds: its job config and CLI, FSDP2 of the whole decoder through
``apply_fsdp``, activation checkpointing, torch.compile, its async DCP checkpointer, the aux-free
bias update hook (``register_moe_load_balancing_hook``), metrics and profiling.

Logged every ``--log-every`` steps (``train_log.jsonl`` in ``--out``, rank 0): the loss (mean over
ranks), and per MoE layer the experts per token, load CV and MaxVio of the step's tokens on all
ranks (``probmoe.analysis.metrics``, over the used slots). ``--save-at S``: the state after step S
(every rank's model and optimizer shards, the routers' generators, the global RNG) is saved, the run
goes on to ``--steps``, then a fresh model is built from the checkpoint and trained from S again:
its losses and final parameters must equal the first run's bit for bit (``resume_check`` in the log).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

warnings.filterwarnings("ignore", message="In CPU autocast")

V, DIM, PAD = 256, 64, 0


def model_config(num_experts: int, top_k: int, kmin: int, seed: int, ep: int):
    from probmoe.integrations.torchtitan import use_probmoe
    from probmoe.integrations.torchtitan.parallel import expert_parallel_config
    from probmoe.integrations.torchtitan.tiny import tiny_qwen3_moe

    cfg = tiny_qwen3_moe(vocab=V, dim=DIM, num_experts=num_experts, top_k=top_k, max_seq_len=1024, fuse_qkv=True)
    use_probmoe(cfg, kmin=kmin, top_k=top_k, seed=seed, expert_parallel_degree=ep)
    expert_parallel_config(cfg, ep)
    return cfg


def build(args, world):
    from probmoe.integrations.torchtitan.parallel import expert_parallel

    cfg = model_config(args.experts, args.top_k, args.kmin, args.seed, world)
    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = cfg.build()
    model.init_states()
    expert_parallel(model, cfg, world)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    return model, opt


def rows(path: str, seq_len: int, rank: int, world: int) -> torch.Tensor:
    """This rank's problems as byte tokens [R, seq_len + 1] (PAD after the text)."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i % world != rank:
                continue
            ex = json.loads(line)
            data = (ex["question"] + "\n" + ex["answer"] + "\n").encode()[: seq_len + 1]
            out.append(list(data) + [PAD] * (seq_len + 1 - len(data)))
    return torch.tensor(out, dtype=torch.long)


def routers(model):
    from probmoe.integrations.torchtitan import ProbMoERouter

    return [(n, m) for n, m in model.named_modules() if isinstance(m, ProbMoERouter)]


def step(model, opt, batch, world):
    """One AdamW step on batch [B, L + 1]: (loss averaged over ranks, per-layer global loads [E])."""
    from probmoe.integrations.torchtitan.parallel import is_expert_parameter

    opt.zero_grad(set_to_none=True)
    tokens, labels = batch[:, :-1], batch[:, 1:]
    logits = model(tokens)  # [B, L, V]
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=PAD)
    loss.backward()
    for p in model.parameters():  # the mean over ranks of the ranks' mean losses
        if p.grad is None:
            continue
        if is_expert_parameter(p):  # the all-to-all already summed every rank's tokens into these
            p.grad.div_(world)
        else:
            dist.all_reduce(p.grad)
            p.grad.div_(world)
    opt.step()
    loads = torch.stack([r.last_routing.selected().sum(0) for _, r in routers(model)]).double()  # [layers, E]
    counts = torch.stack([r.last_routing.counts.double().sum() for _, r in routers(model)])
    t = torch.cat(
        [loss.detach().double().view(1), loads.flatten(), counts, torch.tensor([tokens.numel()], dtype=torch.double)]
    )
    dist.all_reduce(t)
    return float(t[0]) / world, t[1 : 1 + loads.numel()].view_as(loads), t[1 + loads.numel() : -1] / t[-1]


def tensors(model) -> dict:
    """This rank's parameters and buffers as plain tensors (an expert DTensor's local shard), by name.
    Not ``state_dict()``: torchtitan's fused QKV splits its weight into new tensors there."""
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {k: v.to_local() if hasattr(v, "to_local") else v for k, v in named.items()}


def state(model, opt, done: int) -> dict:
    return {
        "model": {k: v.detach().clone() for k, v in tensors(model).items()},
        "opt": opt.state_dict(),
        "step": done,
        "rng": torch.get_rng_state(),
        "generators": {n: r.generator.get_state() for n, r in routers(model)},
    }


def load(model, opt, saved: dict) -> None:
    with torch.no_grad():
        for k, v in tensors(model).items():
            v.copy_(saved["model"][k])
    opt.load_state_dict(saved["opt"])
    torch.set_rng_state(saved["rng"])
    for n, r in routers(model):
        r.generator.set_state(saved["generators"][n])


def train(model, opt, data, start: int, stop: int, args, world, log=None, at_save=None):
    from probmoe.analysis.metrics import load_cv, max_vio

    losses = []
    for s in range(start, stop):
        g = torch.Generator().manual_seed(args.seed * 100_003 + s)  # the batch order: a function of the step
        batch = data[torch.randint(len(data), (args.batch_size,), generator=g)]
        loss, loads, per_token = step(model, opt, batch, world)
        losses.append(loss)
        if log is not None and (s % args.log_every == 0 or s == stop - 1):
            log(
                {
                    "step": s + 1,
                    "loss": loss,
                    "layers": [
                        {
                            "experts_per_token": float(per_token[i]),
                            "load_cv": load_cv(loads[i]),
                            "max_vio": max_vio(loads[i]),
                        }
                        for i in range(loads.shape[0])
                    ],
                }
            )
        if at_save is not None and s + 1 == args.save_at:
            at_save(s + 1)
    return losses


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="GSM8K train.jsonl (not copied)")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--save-at", type=int, default=150)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="rows per rank per step")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=4, help="kmax")
    p.add_argument("--kmin", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args(argv)
    if not 0 < args.save_at < args.steps:
        raise SystemExit(f"--save-at must be in 1..--steps - 1 = {args.steps - 1}, got {args.save_at}")

    from probmoe.integrations.torchtitan.parallel import use_cpu_device

    use_cpu_device()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(args.out, exist_ok=True)
    data = rows(args.data, args.seq_len, rank, world)
    logf = open(os.path.join(args.out, "train_log.jsonl"), "w") if rank == 0 else None

    def log(record):
        if logf is not None:
            logf.write(json.dumps(record) + "\n")
            logf.flush()
            print(json.dumps(record), flush=True)

    ckpt = os.path.join(args.out, f"checkpoint-{args.save_at}-rank{rank}.pt")
    model, opt = build(args, world)
    t0 = time.perf_counter()
    first = train(
        model,
        opt,
        data,
        0,
        args.steps,
        args,
        world,
        log,
        at_save=lambda done: torch.save(state(model, opt, done), ckpt),
    )
    seconds = time.perf_counter() - t0
    final = {k: v.detach().clone() for k, v in tensors(model).items()}

    model, opt = build(args, world)  # a fresh process state, then the checkpoint
    load(model, opt, torch.load(ckpt, weights_only=False))
    again = train(model, opt, data, args.save_at, args.steps, args, world)
    same_params = all(torch.equal(final[k], v) for k, v in tensors(model).items())
    flags = torch.tensor([again == first[args.save_at :], same_params], dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    log(
        {
            "resume_check": {
                "losses_equal": bool(flags[0]),
                "params_equal": bool(flags[1]),
                "resumed_from": args.save_at,
                "steps": args.steps,
            },
            "first_loss": first[0],
            "last_loss": first[-1],
            "train_seconds": round(seconds, 1),
            "ranks": world,
            "threads_per_rank": torch.get_num_threads(),
        }
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
