"""Measured peak memory of probmoe-train steps against ``--plan``'s estimate, on the CPU.

    python tools/memory_plan_check.py                       # the tiny models, one process
    python tools/memory_plan_check.py --model tiny-olmoe --batch-size 8 --max-length 512 --steps 2
    python tools/memory_plan_check.py --model olmoe-1b-7b-shape --layers 1 --param-dtype bfloat16 \
        --nproc 2 --fsdp --batch-size 1 --max-length 128        # the real widths, 2 gloo ranks

Each case runs in fresh processes (``--nproc`` > 1: under torchrun, each rank measured, the
largest reported): a throw-away one-step run loads every import, circuit and
kernel, then the peak resident set
(VmHWM) is reset (/proc/self/clear_refs), the model is built and trained for ``--steps`` steps
(the optimizer state exists from step 1), and the peak growth is compared with the plan's total.
glibc is told to return freed blocks at once (MALLOC_MMAP_THRESHOLD_), so the peak is the
tensors', not the allocator's cache. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, torch
from probmoe.experiments import config_parser, memory_plan
from probmoe.experiments.trainer import TrainConfig, Trainer

def rss(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))

args = json.loads(sys.argv[1])
cfg = config_parser.build(TrainConfig, {**args, "progress": False})
rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
# a throw-away run of one step first: imports, the routing circuits and torch's kernels are loaded
warm = Trainer(config_parser.build(TrainConfig, {**args, "progress": False, "output_dir": args["output_dir"] + "-warm", "max_steps": 1}))
warm.run()
del warm
import gc; gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current resident set
base = rss("VmRSS")
trainer = Trainer(cfg)
trainer.run()
peak = rss("VmHWM") - base
shape, kwargs = memory_plan.for_run(cfg, world, "cpu")
plan = memory_plan.estimate(shape, world_size=world, fsdp=cfg.run.fsdp, **kwargs)
with open(f"{args['output_dir']}.rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "measured": peak, "plan": plan.total, "state": plan.parameters + plan.gradients +
               plan.optimizer, "activations": plan.activations}, f)
from probmoe.experiments import distributed
distributed.teardown()
"""


def measure(
    model: str,
    method: str,
    batch_size: int,
    max_length: int,
    steps: int,
    data: str,
    *,
    checkpointing: bool = False,
    nproc: int = 1,
    fsdp: bool = False,
    layers: int | None = None,
    param_dtype: str = "float32",
    bf16: bool = False,
) -> dict:
    """{"measured", "plan", "state", "activations"} in bytes per process (the rank of the largest
    measured peak) for one run."""
    with tempfile.TemporaryDirectory() as out:
        args = dict(
            model=model,
            data=data,
            output_dir=os.path.join(out, "run"),
            method=method,
            batch_size=batch_size,
            max_length=max_length,
            max_steps=steps,
            aux_loss=0.0,
            gradient_checkpointing=checkpointing,
            device="cpu",
            fsdp=fsdp,
            layers=layers,
            param_dtype=param_dtype,
            bf16=bf16,
        )
        script = os.path.join(out, "child.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(CHILD)
        env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
        launcher = (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
            if nproc > 1 or fsdp
            else [sys.executable]
        )
        done = subprocess.run(
            [*launcher, script, json.dumps(args)], env=env, capture_output=True, text=True, timeout=1800
        )
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        results = []
        for rank in range(nproc):
            with open(f"{args['output_dir']}.rank{rank}.json", encoding="utf-8") as f:
                results.append(json.load(f))
        return max(results, key=lambda r: r["measured"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/work/shared/data/gsm8k/train.jsonl")
    p.add_argument("--model", action="append", help="default: every tiny model")
    p.add_argument("--method", default="probmoe")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--nproc", type=int, default=1, help="processes (torchrun, gloo)")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--layers", type=int)
    p.add_argument("--param-dtype", default="float32", choices=("float32", "bfloat16"))
    args = p.parse_args()
    from probmoe.experiments.models import TINY

    print(
        f"CPU: 2-core AMD EPYC with AVX-512 (this machine's); {args.nproc} process(es)"
        f"{', FSDP' if args.fsdp else ''}; batch {args.batch_size} x {args.max_length}; MiB per process"
    )
    print(f"{'model':<18}{'plan':>9}{'state':>9}{'activ.':>9}{'measured':>10}{'meas/plan':>11}")
    for model in args.model or list(TINY):
        r = measure(
            model,
            args.method,
            args.batch_size,
            args.max_length,
            args.steps,
            args.data,
            checkpointing=args.gradient_checkpointing,
            nproc=args.nproc,
            fsdp=args.fsdp,
            layers=args.layers,
            param_dtype=args.param_dtype,
            bf16=args.bf16,
        )
        mib = {k: v / 2**20 for k, v in r.items()}
        print(
            f"{model:<18}{mib['plan']:>9.1f}{mib['state']:>9.1f}{mib['activations']:>9.1f}{mib['measured']:>10.1f}"
            f"{r['measured'] / r['plan']:>11.2f}"
        )


if __name__ == "__main__":
    main()
