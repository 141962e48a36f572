"""The small real-data study of docs/results.md: tiny OLMoE-shaped models fine-tuned on GSM8K with
each routing method and several seeds, for the same budget of optimizer steps, then evaluated
(answer loss on test problems, greedy exact match) and analysed (routing per layer).

    python tools/gsm8k_study.py --output study/ [--steps 60] [--seeds 0 1 2] [--methods ...]

Runs ``probmoe-train``, ``probmoe-eval`` and ``probmoe-analyze`` as a user would (one process each;
every command line is written to ``study/commands.txt``), then writes ``study/summary.json``,
``study/summary.md`` (the table for docs/results.md) and ``study/loss.png``. Finished runs are
skipped when the study is started again.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from probmoe.integrations.method_names import METHODS  # the grouped method needs a grouped family: not here

GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


def sh(cmd: list[str], log) -> None:
    log.write(shlex.join(cmd) + "\n")
    log.flush()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def run_one(args, method: str, seed: int, log) -> dict:
    out = args.output / "runs" / f"{method}-seed{seed}"
    summary = out / "eval-saved" / "summary.json"
    if not summary.exists():
        start = time.perf_counter()
        if not (out / "model.safetensors").exists():
            sh(["probmoe-train", "--model", args.model, "--data", str(args.train), "--output-dir", str(out),
                "--method", method, "--max-steps", str(args.steps), "--batch-size", str(args.batch_size),
                "--lr", str(args.lr), "--max-length", str(args.max_length), "--seed", str(seed), "--no-progress"], log)
        train_s = time.perf_counter() - start
        sh(["probmoe-eval", "--checkpoint", str(out), "--data", str(args.test), "--limit", str(args.eval_problems),
            "--max-new-tokens", str(args.max_new_tokens), "--batch-size", "16", "--no-progress"], log)
        data = json.loads(summary.read_text())
        data["train_s"] = train_s
        summary.write_text(json.dumps(data, indent=2) + "\n")
    result = json.loads(summary.read_text())
    train_log = [json.loads(line) for line in open(out / "train_log.jsonl") if '"loss"' in line]
    result["train_loss"] = [r["loss"] for r in train_log]
    return result


def table(results: dict) -> str:
    lines = ["| method | test answer loss (mean ± sd over seeds) | exact match (flexible) | experts/token | "
             "final train loss | train time / run |", "|---|---|---|---|---|---|"]
    for method, runs in results.items():
        loss = [r["answer_loss"] for r in runs]
        em = [r.get("exact_match_flexible", 0.0) for r in runs]
        sd = statistics.stdev(loss) if len(loss) > 1 else 0.0
        lines.append(f"| {method} | {statistics.mean(loss):.4f} ± {sd:.4f} | {statistics.mean(em):.2%} | "
                     f"{statistics.mean(r['experts_per_token'] for r in runs):.2f} | "
                     f"{statistics.mean(r['train_loss'][-1] for r in runs):.4f} | "
                     f"{statistics.mean(r['train_s'] for r in runs):.0f} s |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="constrained")
    curves, bars = fig.subplots(1, 2)
    for i, (method, runs) in enumerate(results.items()):
        color = f"C{i}"
        for j, r in enumerate(runs):
            curves.plot(range(1, len(r["train_loss"]) + 1), r["train_loss"], color=color, alpha=0.6, lw=1,
                        label=method if j == 0 else None)
        loss = [r["answer_loss"] for r in runs]
        bars.bar(i, statistics.mean(loss), color=color, alpha=0.7)
        bars.scatter([i] * len(loss), loss, color="black", s=10, zorder=3)
    curves.set(xlabel="optimizer step", ylabel="training loss (answer tokens)", title="Training loss, every seed")
    curves.legend(fontsize=8)
    bars.set_xticks(range(len(results)), list(results), rotation=30, ha="right")
    lows = [r["answer_loss"] for runs in results.values() for r in runs]
    bars.set_ylim(min(lows) - 0.05, max(lows) + 0.05)
    bars.set(ylabel="test answer loss", title="GSM8K test answer loss (mean; dots: seeds)")
    fig.savefig(path, dpi=150)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--model", default="tiny-olmoe")
    p.add_argument("--train", type=Path, default=GSM8K / "train.jsonl")
    p.add_argument("--test", type=Path, default=GSM8K / "test.jsonl")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--eval-problems", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args(argv)
    for path in (args.train, args.test):
        if not path.is_file():
            p.error(f"data file {path} does not exist")
    args.output.mkdir(parents=True, exist_ok=True)
    results = {}
    from tqdm import tqdm

    jobs = [(m, s) for m in args.methods for s in args.seeds]
    with open(args.output / "commands.txt", "a", encoding="utf-8") as log:
        for method, seed in tqdm(jobs, desc="study", unit="run"):
            results.setdefault(method, []).append(run_one(args, method, seed, log))
        runs = [f"{m}={args.output / 'runs' / f'{m}-seed{args.seeds[0]}'}" for m in args.methods]
        sh(["probmoe-analyze", *[a for r in runs for a in ("--checkpoint", r)], "--data", str(args.test),
            "--limit", "64", "--output", str(args.output / "analysis"), "--no-progress"], log)
    (args.output / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.output / "summary.md").write_text(table(results))
    plot(results, args.output / "loss.png")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
