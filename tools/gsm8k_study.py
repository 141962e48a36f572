"""The small real-data study of docs/reports/results-tiny-models-epyc-2026-11.md: tiny OLMoE-shaped models fine-tuned on GSM8K with
each routing method and several seeds, for the same budget of optimizer steps, then evaluated
(answer loss on test problems, greedy exact match) and analysed (routing per layer).

    python tools/gsm8k_study.py --output study/ [--steps 60] [--seeds 0 1 2] [--methods ...]

Runs ``probmoe-train``, ``probmoe-eval`` and ``probmoe-analyze`` as a user would (one process each;
every command line is written to ``study/commands.txt``), then writes ``study/summary.json``,
``study/summary.md`` (the table for docs/reports/results-tiny-models-epyc-2026-11.md), ``study/loss.png`` and, when the four
ablation methods (probmoe, densemixer, sample-dense-ste, topk-marginal) are in the study,
``study/ablation.png`` (the paper's fig:ablation_study box plot). Finished runs are skipped when the
study is started again. ``--no-analysis`` runs no ``probmoe-analyze`` (a study split over several
processes, analysed on its own). ``--finished`` trains and evaluates nothing: it summarises and
draws the runs of ``--methods`` x ``--seeds`` already finished under ``--output`` (a study cut
short, or still running), leaving out the others.
"""

from __future__ import annotations

import argparse
import json
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
            sh(
                [
                    "probmoe-train",
                    "--model",
                    args.model,
                    "--data",
                    str(args.train),
                    "--output-dir",
                    str(out),
                    "--method",
                    method,
                    "--max-steps",
                    str(args.steps),
                    "--batch-size",
                    str(args.batch_size),
                    "--lr",
                    str(args.lr),
                    "--max-length",
                    str(args.max_length),
                    "--seed",
                    str(seed),
                    "--no-progress",
                ],
                log,
            )
        train_s = time.perf_counter() - start
        sh(
            [
                "probmoe-eval",
                "--checkpoint",
                str(out),
                "--data",
                str(args.test),
                "--limit",
                str(args.eval_problems),
                "--max-new-tokens",
                str(args.max_new_tokens),
                "--batch-size",
                "16",
                "--no-progress",
            ],
            log,
        )
        data = json.loads(summary.read_text())
        data["train_s"] = train_s
        summary.write_text(json.dumps(data, indent=2) + "\n")
    return load_run(out, seed)


def load_run(out: Path, seed: int) -> dict:
    """A finished run's evaluation summary, with its seed and its training losses."""
    result = json.loads((out / "eval-saved" / "summary.json").read_text())
    train_log = [json.loads(line) for line in open(out / "train_log.jsonl") if '"loss"' in line]
    result["seed"] = seed
    result["train_loss"] = [r["loss"] for r in train_log]
    return result


def finished(args) -> dict:
    """{method: [load_run of each seed finished]} for the runs under ``args.output`` with an
    evaluation; methods without one are left out."""
    results = {}
    for method in args.methods:
        for seed in args.seeds:
            out = args.output / "runs" / f"{method}-seed{seed}"
            if (out / "eval-saved" / "summary.json").is_file() and (out / "train_log.jsonl").is_file():
                results.setdefault(method, []).append(load_run(out, seed))
    return results


def write_summary(results: dict, output: Path) -> None:
    """summary.json, summary.md, loss.png and (with the four ablation methods) ablation.png."""
    (output / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    (output / "summary.md").write_text(table(results))
    plot(results, output / "loss.png")
    plot_ablation(results, output / "ablation.png")
    print(table(results))


def train_time(runs: list[dict]) -> str:
    """The mean training time of ``runs``, or "n/a" when a run's time was not recorded (the
    process that trained it was stopped before writing it)."""
    times = [r.get("train_s") for r in runs]
    return "n/a" if None in times else f"{statistics.mean(times):.0f} s"


def table(results: dict) -> str:
    lines = [
        "| method | seeds | test answer loss (mean ± sd over seeds) | exact match (flexible) | experts/token | "
        "final train loss | train time / run |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, runs in results.items():
        loss = [r["answer_loss"] for r in runs]
        em = [r.get("exact_match_flexible", 0.0) for r in runs]
        sd = statistics.stdev(loss) if len(loss) > 1 else 0.0
        seeds = ", ".join(str(r.get("seed", "?")) for r in runs)
        lines.append(
            f"| {method} | {seeds} | {statistics.mean(loss):.4f} ± {sd:.4f} | {statistics.mean(em):.2%} | "
            f"{statistics.mean(r['experts_per_token'] for r in runs):.2f} | "
            f"{statistics.mean(r['train_loss'][-1] for r in runs):.4f} | "
            f"{train_time(runs)} |"
        )
    return "\n".join(lines) + "\n"


def _smooth(values: list[float], window: int) -> list[float]:
    """The trailing mean over ``window`` steps (fewer at the start)."""
    return [statistics.mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def plot(results: dict, path: Path) -> None:
    """Training loss (mean over seeds per method, smoothed, with the seeds' range shaded) and the
    test answer loss (every seed a dot, the mean ± sd a bar): one line per method, not per run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    curves, points = fig.subplots(1, 2, width_ratios=[1.4, 1])
    styles = ("-", "--", "-.", ":")
    for i, (method, runs) in enumerate(results.items()):
        steps = min(len(r["train_loss"]) for r in runs)
        window = max(1, steps // 10)
        smoothed = [_smooth(r["train_loss"][:steps], window) for r in runs]  # [seeds][steps]
        mean = [statistics.mean(column) for column in zip(*smoothed)]
        xs = range(1, steps + 1)
        curves.plot(xs, mean, color=f"C{i}", linestyle=styles[i % len(styles)], lw=1.5, label=method)
        curves.fill_between(
            xs, [min(c) for c in zip(*smoothed)], [max(c) for c in zip(*smoothed)], color=f"C{i}", alpha=0.12, lw=0
        )
        loss = [r["answer_loss"] for r in runs]
        sd = statistics.stdev(loss) if len(loss) > 1 else 0.0
        points.errorbar(i, statistics.mean(loss), yerr=sd, fmt="_", color=f"C{i}", markersize=18, capsize=5, lw=1.5)
        points.scatter([i] * len(loss), loss, color=f"C{i}", edgecolor="black", s=22, zorder=3)
    seeds = ", ".join(f"{m} {len(runs)}" for m, runs in results.items())
    curves.set(xlabel="optimizer step", ylabel="training loss (answer tokens; trailing mean)")
    curves.set_title(f"Training loss: mean over seeds, range shaded\n(seeds: {seeds})", fontsize="medium")
    curves.legend(fontsize=8, ncols=2)
    curves.grid(alpha=0.3)
    points.set_xticks(range(len(results)), list(results), rotation=30, ha="right")
    points.set(
        ylabel="test answer loss (nats per token)",
        title="GSM8K test answer loss: seeds (dots), mean ± sd\n(y axis zoomed to the data, not from 0)",
    )
    points.grid(alpha=0.3, axis="y")
    fig.savefig(path, dpi=150)


ABLATION = {
    "probmoe": "Sample +\nMarginal\n(ProbMoE)",
    "densemixer": "Top-k +\nDense STE\n(DenseMixer)",
    "sample-dense-ste": "Sample +\nDense STE",
    "topk-marginal": "Top-k +\nMarginal",
}


def plot_ablation(results: dict, path: Path) -> bool:
    """The paper's fig:ablation_study: box plots over seeds of exact match (flexible) and of the
    test answer loss for the four forward x backward combinations; False (nothing drawn) unless the
    study has all four."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not all(m in results for m in ABLATION):
        return False
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    em_ax, loss_ax = fig.subplots(1, 2)
    seeds = "/".join(str(len(results[m])) for m in ABLATION)  # runs per box
    for ax, key, scale, label in (
        (em_ax, "exact_match_flexible", 100, "exact match, flexible (%)"),
        (loss_ax, "answer_loss", 1, "test answer loss (nats per token)"),
    ):
        data = [[scale * r.get(key, 0.0) for r in results[m]] for m in ABLATION]  # [4 methods][seeds]
        if max(max(values) for values in data) == 0:
            ax.set_ylim(-1, 5)  # all zero: a visible flat line at 0, not a squashed axis
        ax.boxplot(
            data,
            tick_labels=list(ABLATION.values()),
            widths=0.5,
            showmeans=True,
            meanprops=dict(marker="D", markerfacecolor="white", markeredgecolor="black", markersize=5),
        )
        for i, values in enumerate(data):
            ax.scatter([i + 1] * len(values), values, color=f"C{i}", s=18, zorder=3)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    em_ax.set_title(f"Exact match ({seeds} seeds; higher is better)", fontsize="medium")
    loss_ax.set_title(f"Test answer loss ({seeds} seeds; lower is better)", fontsize="medium")
    fig.suptitle(
        "Ablation: forward routing x backward estimator, exact-k (box: quartiles; line: median; "
        "diamond: mean; dots: seeds)",
        fontsize="medium",
    )
    fig.savefig(path, dpi=150)
    return True


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
    p.add_argument(
        "--no-analysis",
        action="store_true",
        help="train and evaluate, but run no probmoe-analyze "
        "(when the study is split over several processes, or analysed separately)",
    )
    p.add_argument(
        "--finished",
        action="store_true",
        help="train and evaluate nothing: summarise and draw the runs already finished under --output",
    )
    args = p.parse_args(argv)
    if args.finished:
        results = finished(args)
        if not results:
            p.error(
                f"--finished: no finished run of {', '.join(args.methods)} with seeds "
                f"{', '.join(map(str, args.seeds))} under {args.output / 'runs'}"
            )
        write_summary(results, args.output)
        return 0
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
        if not args.no_analysis:
            sh(
                [
                    "probmoe-analyze",
                    *[a for r in runs for a in ("--checkpoint", r)],
                    "--data",
                    str(args.test),
                    "--limit",
                    "64",
                    "--output",
                    str(args.output / "analysis"),
                    "--overwrite",
                    "--no-progress",
                ],
                log,
            )
    write_summary(results, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
