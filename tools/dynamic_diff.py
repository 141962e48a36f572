"""The paper's ``tab:dynamic_diff``: ProbMoE Dynamic-k against ProbMoE Exact-k, per data set, as the
exact-match difference and the average fraction of experts Dynamic-k uses.

    python tools/dynamic_diff.py --dataset GSM=../shared/data/gsm8k/test.jsonl \\
        --exact GSM=runs/probmoe --dynamic GSM=runs/probmoe-dynamic --limit 200 --output dynamic-diff/

Per data set (``--dataset NAME=FILE``, repeat for more; records with ``question`` and a GSM8K-style
``answer`` ending in ``#### n``) one Exact-k and one Dynamic-k checkpoint fine-tuned on it
(``--exact NAME=DIR``, ``--dynamic NAME=DIR``), each evaluated with the routing it was saved with
(Exact-k: k experts per token; Dynamic-k: the MAP subset with kmin <= |S| <= kmax): greedy exact
match (flexible and strict, as ``probmoe-eval``) on the first ``--limit`` records, and the experts
per token over every token routed while doing so (``probmoe.eval.routing_tally``; prompts and
generated tokens, padding excluded). The table's cell is, as the paper's,

    EM(Dynamic-k) - EM(Exact-k) in percentage points (experts per token of Dynamic-k / of Exact-k, %)

Writes ``dynamic_diff.md`` (that table, then the measured values), ``dynamic_diff.csv`` (one row per
data set) and ``dynamic_diff.json`` into ``--output``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

from tqdm.auto import tqdm

from probmoe.experiments import options

FILES = ("dynamic_diff.md", "dynamic_diff.csv", "dynamic_diff.json")
FIELDS = (
    "dataset",
    "problems",
    "exact_checkpoint",
    "exact_routing",
    "dynamic_checkpoint",
    "dynamic_routing",
    "exact_em",
    "dynamic_em",
    "em_difference_pp",
    "exact_em_strict",
    "dynamic_em_strict",
    "exact_experts_per_token",
    "dynamic_experts_per_token",
    "fraction_of_experts",
)


def _pairs(flag: str, specs: list[str]) -> dict[str, str]:
    """{name: value} from ``NAME=VALUE`` arguments of ``flag``; ValueError naming the flag."""
    out = {}
    for spec in specs or []:
        name, sep, value = spec.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{flag} must be NAME=VALUE (the data set's name), got {spec!r}")
        if name in out:
            raise ValueError(f"{flag}: the data set {name!r} is given twice")
        out[name] = value
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dynamic_diff.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--dataset",
        action="append",
        required=True,
        metavar="NAME=FILE",
        help="a data set of question/answer records (.jsonl, .json, .parquet); repeat for more",
    )
    p.add_argument(
        "--exact",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="the ProbMoE Exact-k checkpoint fine-tuned on data set NAME",
    )
    p.add_argument(
        "--dynamic",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="the ProbMoE Dynamic-k checkpoint fine-tuned on data set NAME",
    )
    p.add_argument("--output", required=True, help="folder for dynamic_diff.md, .csv and .json")
    p.add_argument("--limit", type=options.positive_int, help="the first N records of each data set (default: all)")
    p.add_argument("--max-new-tokens", type=options.positive_int, default=256)
    p.add_argument("--batch-size", type=options.positive_int, default=16)
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--dtype", choices=options.DTYPES, default="float32")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)

    def check():
        from probmoe.experiments import checkpoints, formats

        args.datasets = _pairs("--dataset", args.dataset)
        args.exact_runs, args.dynamic_runs = _pairs("--exact", args.exact), _pairs("--dynamic", args.dynamic)
        for flag, runs in (("--exact", args.exact_runs), ("--dynamic", args.dynamic_runs)):
            if set(runs) != set(args.datasets):
                raise ValueError(
                    f"{flag} must name one checkpoint for each --dataset ({', '.join(args.datasets)}), "
                    f"got {', '.join(runs) or 'none'}"
                )
            for path in runs.values():
                checkpoints.check(path, flag)
        args.records = {
            name: formats.read(path, "question-answer").head(args.limit).rows for name, path in args.datasets.items()
        }
        options.check_output_folder(args.output, FILES, args.overwrite)
        args.device = options.device(args.device)

    options.run_or_exit(p, check)
    args.parser = p
    return args


def evaluate(path: str, records: list[dict], args) -> dict:
    """{"routing", "em", "em_strict", "experts_per_token"} of one checkpoint under its saved routing."""
    import torch
    from dynamic_k_study import gsm8k_scores

    from probmoe.eval.routing_tally import RoutingTally
    from probmoe.experiments import checkpoints

    model, tokenizer = checkpoints.load(path, device=args.device, dtype=getattr(torch, args.dtype))
    tally = RoutingTally(model)
    scores = gsm8k_scores(model, tokenizer, records, args)
    return {
        "routing": checkpoints.describe(model),
        "em": scores["exact_match_flexible"],
        "em_strict": scores["exact_match_strict"],
        "experts_per_token": tally.summary()["experts_per_token"],
    }


def row(name: str, args, exact: dict, dynamic: dict) -> dict:
    return {
        "dataset": name,
        "problems": len(args.records[name]),
        "exact_checkpoint": args.exact_runs[name],
        "exact_routing": exact["routing"],
        "dynamic_checkpoint": args.dynamic_runs[name],
        "dynamic_routing": dynamic["routing"],
        "exact_em": exact["em"],
        "dynamic_em": dynamic["em"],
        "em_difference_pp": 100 * (dynamic["em"] - exact["em"]),
        "exact_em_strict": exact["em_strict"],
        "dynamic_em_strict": dynamic["em_strict"],
        "exact_experts_per_token": exact["experts_per_token"],
        "dynamic_experts_per_token": dynamic["experts_per_token"],
        "fraction_of_experts": dynamic["experts_per_token"] / exact["experts_per_token"],
    }


def markdown(rows: list[dict], args) -> str:
    lines = [
        "Dynamic-k relative to Exact-k: exact-match difference in percentage points (flexible), with the "
        "average fraction of experts Dynamic-k uses (its experts per token over Exact-k's) in parentheses; "
        f"greedy, {args.max_new_tokens} new tokens.",
        "",
        "| data set | Dynamic-k − Exact-k |",
        "|---|---|",
    ]
    lines += [
        f"| {r['dataset']} | {r['em_difference_pp']:+.2f} ({100 * r['fraction_of_experts']:.2f}%) |" for r in rows
    ]
    lines += [
        "",
        "| data set | problems | Exact-k routing | EM | Dynamic-k routing | EM | experts/token Exact-k | "
        "experts/token Dynamic-k |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['dataset']} | {r['problems']} | {r['exact_routing']} | {100 * r['exact_em']:.2f}% | "
        f"{r['dynamic_routing']} | {100 * r['dynamic_em']:.2f}% | {r['exact_experts_per_token']:.3f} | "
        f"{r['dynamic_experts_per_token']:.3f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = []
    for name in tqdm(args.datasets, desc="data sets", dynamic_ncols=True):
        exact = options.run_or_exit(args.parser, lambda: evaluate(args.exact_runs[name], args.records[name], args))
        dynamic = options.run_or_exit(args.parser, lambda: evaluate(args.dynamic_runs[name], args.records[name], args))
        rows.append(row(name, args, exact, dynamic))
    os.makedirs(args.output, exist_ok=True)  # only once every checkpoint has been evaluated
    text = markdown(rows, args)
    with open(os.path.join(args.output, "dynamic_diff.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(args.output, "dynamic_diff.csv"), "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(args.output, "dynamic_diff.json"), "w", encoding="utf-8") as f:
        json.dump(
            {"datasets": args.datasets, "limit": args.limit, "max_new_tokens": args.max_new_tokens, "rows": rows},
            f,
            indent=1,
        )
        f.write("\n")
    print(text)
    print(f"{', '.join(FILES)} in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
