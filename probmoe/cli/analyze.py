"""``probmoe-analyze``: the paper's routing analyses of one or more checkpoints, side by side.

    probmoe-analyze --checkpoint runs/conventional --checkpoint runs/probmoe \\
        --data ../shared/data/gsm8k/test.jsonl --limit 64 --output analysis/

Per MoE layer: experts to cover α of the routing probability (softmax of the router logits;
normalised sigmoid scores for DeepSeek-V3) (Fig. 3), top-4 mass and normalised
entropy (Fig. 4), experts per token (Fig. 5), token frequency against active experts (Fig. 6),
expert-load CV and MaxVio. Writes ``analysis.json``, ``analysis.csv`` and PNG figures.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

from . import common

CSV_FIELDS = ("run", "layer", "name", "tokens", "experts", "coverage_0.5", "coverage_0.9", "coverage_0.99",
              "top_mass", "entropy", "cardinality_mean", "load_cv", "max_vio")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="probmoe-analyze", description="Routing analyses per layer (the ProbMoE "
                                "paper's Figs. 3-6, load balance) of checkpoints, side by side: JSON, CSV, PNG.")
    p.add_argument("--checkpoint", action="append", required=True, metavar="[NAME=]DIR",
                   help="a checkpoint directory, optionally named (repeat for side-by-side)")
    p.add_argument("--data", required=True, help="records in any format of probmoe-train (.jsonl, .json, .parquet); "
                   "the routing of the whole texts is analysed")
    common.add_data_format_flag(p)
    p.add_argument("--output", required=True, help="folder for analysis.json, analysis.csv and the figures")
    p.add_argument("--limit", type=common.positive_int, default=64, help="the first N records (default 64)")
    p.add_argument("--batch-size", type=common.positive_int, default=16)
    p.add_argument("--max-length", type=common.positive_int, default=1024)
    common.add_routing_flags(p, required=False)
    common.add_model_flags(p)
    return p


def named(specs: list[str]) -> dict[str, str]:
    """{name: directory} from ``[NAME=]DIR`` arguments; the name defaults to the folder's name."""
    runs = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or os.path.isdir(spec):
            name, path = os.path.basename(os.path.normpath(spec)), spec
        if name in runs:
            raise ValueError(f"--checkpoint: two runs are named {name!r}; name them NAME=DIR")
        runs[name] = path
    return runs


def csv_rows(results: dict) -> list[dict]:
    rows = []
    for run, layers in results.items():
        for i, s in enumerate(layers):
            rows.append({"run": run, "layer": i, "name": s["name"], "tokens": s["tokens"], "experts": s["experts"],
                         **{f"coverage_{a}": s["coverage"][a] for a in ("0.5", "0.9", "0.99")},
                         "top_mass": s["top_mass"], "entropy": s["entropy"], "cardinality_mean": s["cardinality_mean"],
                         "load_cv": s["load_cv"], "max_vio": s["max_vio"]})
    return rows


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    common.require_extras(p)
    common.quiet_progress(args.no_progress)

    def body():
        import torch

        from probmoe.experiments import checkpoints, formats

        runs = named(args.checkpoint)
        for path in runs.values():
            checkpoints.check(path)
        records = formats.read(args.data, args.data_format).head(args.limit)
        common.check_output_folder(args.output, ("analysis.json", "analysis.csv"), args.overwrite)
        return runs, records, common.device(args.device), getattr(torch, args.dtype)

    runs, records, device, dtype = common.run_or_exit(p, body)
    from tqdm.auto import tqdm

    from probmoe.analysis import metrics, plots
    from probmoe.experiments import capture, checkpoints, data

    def progress(iterable, desc):
        return tqdm(iterable, desc=desc, disable=args.no_progress, dynamic_ncols=True)

    routing = dict(k=args.k, kmin=args.kmin, kmax=args.kmax, backend=args.backend, grad=args.grad)
    results, described = {}, {}
    for name, path in runs.items():
        model, tokenizer = common.run_or_exit(p, lambda: checkpoints.load(path, method=args.method, device=device,
                                                                           dtype=dtype, **routing))
        described[name] = checkpoints.describe(model)
        encoded = common.run_or_exit(p, lambda: data.encode_all(tokenizer, records, args.max_length))
        layers = capture.capture(model, tokenizer, encoded, args.batch_size, progress)
        results[name] = [dict(name=layer.name, **metrics.layer_summary(layer.probs, layer.selected, layer.token_ids))
                         for layer in layers]
    os.makedirs(args.output, exist_ok=True)  # only once every model has loaded and routed
    with open(os.path.join(args.output, "analysis.json"), "w", encoding="utf-8") as f:
        json.dump({"data": args.data, "format": records.format, "records": len(records), "routing": described,
                   "runs": results}, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.output, "analysis.csv"), "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(results))
    figures = plots.plot_all(results, args.output)
    for run, layers in results.items():
        cover = ", ".join(f"{s['coverage']['0.9']:.2f}" for s in layers)
        card = ", ".join(f"{s['cardinality_mean']:.2f}" for s in layers)
        print(f"{run} [{described[run]}]: experts to cover 90% per layer {cover}; experts per token {card}")
    print(f"{len(figures)} figures, analysis.json and analysis.csv in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
