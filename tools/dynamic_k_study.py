"""The paper's training/inference-mismatch study (``tab:dynamic_k_4_8``): every checkpoint under one
dynamic-k MAP inference rule, with its accuracy and the experts it uses per token.

    python tools/dynamic_k_study.py --checkpoint conventional=runs/conv --checkpoint probmoe=runs/pm \\
        --data ../shared/data/gsm8k/test.jsonl --limit 200 --output study-dk/          # GSM8K exact match
    python tools/dynamic_k_study.py --checkpoint ... --tasks mmlu --output study-dk/   # harness tasks instead

Each checkpoint is loaded with ``--method probmoe-dynamic --kmin 4 --kmax 8`` (the paper's range;
``--kmin``/``--kmax`` change it) whatever it was trained with, then scored: GSM8K greedy exact match
(flexible and strict, as ``probmoe-eval``) over the first ``--limit`` problems, or the harness
tasks' first metric. The experts per token are counted over every token the model routes while
doing so (prompts and generated tokens; padding excluded), per MoE layer and overall
(``probmoe.eval.routing_tally``). Writes ``study.csv``, ``study.md`` and ``study.json`` into ``--output``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

from tqdm.auto import tqdm

from probmoe.config import BACKENDS
from probmoe.experiments import options

FILES = ("study.csv", "study.md", "study.json")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dynamic_k_study.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint",
        action="append",
        required=True,
        metavar="[NAME=]DIR",
        help="a checkpoint directory, optionally named (repeat: one row each)",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--data", help="GSM8K records with question and answer (.jsonl, .json or .parquet): greedy exact match"
    )
    source.add_argument("--tasks", help="comma-separated LM Evaluation Harness tasks (pip install 'probmoe[eval]')")
    p.add_argument("--include-path", help="a folder of your own task YAML (with --tasks)")
    p.add_argument("--output", required=True, help="folder for study.csv, study.md and study.json")
    p.add_argument("--kmin", type=options.positive_int, default=4, help="fewest experts per token (default 4)")
    p.add_argument("--kmax", type=options.positive_int, default=8, help="most experts per token (default 8)")
    p.add_argument("--limit", type=options.positive_int, help="the first N problems (of each task)")
    p.add_argument("--max-new-tokens", type=options.positive_int, default=256)
    p.add_argument("--batch-size", type=options.positive_int, default=16)
    p.add_argument("--backend", choices=BACKENDS, default=BACKENDS[0])
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--dtype", choices=options.DTYPES, default="float32")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    if args.kmin > args.kmax:
        p.error(f"--kmin ({args.kmin}) must be <= --kmax ({args.kmax})")
    if args.include_path and not args.tasks:
        p.error("--include-path needs --tasks")

    def check():
        from probmoe.experiments import checkpoints, formats

        args.runs = options.named(args.checkpoint)
        for path in args.runs.values():
            checkpoints.check(path)
        args.records = formats.read(args.data, "question-answer").head(args.limit).rows if args.data else None
        options.check_output_folder(args.output, FILES, args.overwrite)
        args.device = options.device(args.device)

    options.run_or_exit(p, check)
    args.parser = p
    return args


def trained_with(path: str) -> str:
    """The routing a checkpoint was saved with (its probmoe_routing.json), or "stock"."""
    from probmoe.integrations.transformers import SETTINGS_FILENAME

    try:
        with open(os.path.join(path, SETTINGS_FILENAME), encoding="utf-8") as f:
            return str(json.load(f).get("method", "?"))
    except FileNotFoundError:
        return "stock"
    except (OSError, ValueError):
        return "?"


def gsm8k_scores(model, tokenizer, records: list[dict], args) -> dict[str, float]:
    """Greedy exact match (flexible, strict) over ``records``, as probmoe-eval scores it."""
    from probmoe.eval import generation

    correct = {"flexible": 0, "strict": 0}
    for start in tqdm(range(0, len(records), args.batch_size), desc="generate", leave=False, dynamic_ncols=True):
        chunk = records[start : start + args.batch_size]
        for record, text in zip(
            chunk, generation.complete(model, tokenizer, [r["question"] for r in chunk], args.max_new_tokens)
        ):
            scored = generation.score(record, text)
            for mode in correct:
                correct[mode] += scored[f"correct_{mode}"]
    return {f"exact_match_{mode}": n / len(records) for mode, n in correct.items()}


def evaluate_one(path: str, args) -> tuple[dict[str, float], dict, str]:
    """(scores, RoutingTally summary, routing described) of one checkpoint under the study's rule."""
    import torch

    from probmoe.eval.routing_tally import RoutingTally
    from probmoe.experiments import checkpoints

    routing = dict(method="probmoe-dynamic", kmin=args.kmin, kmax=args.kmax, backend=args.backend)
    if args.tasks:
        from probmoe.eval import harness

        lm = harness.ProbMoELM(path, device=args.device, dtype=args.dtype, batch_size=args.batch_size, **routing)
        manager = harness.task_manager(harness.parse_tasks(args.tasks), args.include_path)
        results = harness.evaluate(lm, harness.parse_tasks(args.tasks), manager, limit=args.limit)
        scores = {
            f"{task}:{m[0]}": m[1]
            for task, values in results["results"].items()
            if (m := harness.headline(values)) is not None
        }
        return scores, results["probmoe"]["routing_statistics"], lm.routing
    model, tokenizer = checkpoints.load(path, device=args.device, dtype=getattr(torch, args.dtype), **routing)
    tally = RoutingTally(model)
    scores = gsm8k_scores(model, tokenizer, args.records, args)
    return scores, tally.summary(), checkpoints.describe(model)


def rows(results: dict) -> tuple[list[str], list[list]]:
    """The study's table: header and one row per run (scores, experts/token overall and per layer)."""
    score_keys = list(dict.fromkeys(k for r in results.values() for k in r["scores"]))
    layers = max(len(r["routing_statistics"]["layers"]) for r in results.values())
    header = ["run", "trained with", *score_keys, "experts/token", *(f"layer {i}" for i in range(layers)), "tokens"]
    table = []
    for name, r in results.items():
        stats = r["routing_statistics"]
        table.append(
            [
                name,
                r["trained_with"],
                *(r["scores"].get(k, "") for k in score_keys),
                stats["experts_per_token"],
                *(layer["experts_per_token"] for layer in stats["layers"]),
                stats["tokens"],
            ]
        )
    return header, table


def markdown(header: list[str], table: list[list], args, rule: str) -> str:
    def cell(value):
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = [
        f"Inference rule: {rule}; "
        + (
            f"GSM8K {args.data}, {len(args.records)} problems, greedy, {args.max_new_tokens} new tokens"
            if args.data
            else f"tasks {args.tasks}"
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    results = {}
    for name, path in tqdm(args.runs.items(), desc="checkpoints", dynamic_ncols=True):
        scores, stats, rule = options.run_or_exit(args.parser, lambda: evaluate_one(path, args))
        results[name] = {
            "checkpoint": path,
            "trained_with": trained_with(path),
            "scores": scores,
            "routing_statistics": stats,
        }
    os.makedirs(args.output, exist_ok=True)  # only once every checkpoint has been evaluated
    header, table = rows(results)
    with open(os.path.join(args.output, "study.csv"), "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([header, *table])
    text = markdown(header, table, args, rule)
    with open(os.path.join(args.output, "study.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(args.output, "study.json"), "w", encoding="utf-8") as f:
        json.dump(
            {"rule": rule, "data": args.data, "tasks": args.tasks, "limit": args.limit, "runs": results}, f, indent=1
        )
        f.write("\n")
    print(text)
    print(f"study.csv, study.md and study.json in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
