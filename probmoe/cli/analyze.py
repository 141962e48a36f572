"""``probmoe-analyze``: the paper's routing analyses of one or more checkpoints, side by side.

    probmoe-analyze --checkpoint runs/conventional --checkpoint runs/probmoe \\
        --data ../shared/data/gsm8k/test.jsonl --limit 64 --output analysis/

Per MoE layer: the mean over tokens of the fewest experts whose routing probability (softmax of
the router logits; normalised sigmoid scores for DeepSeek-V3) reaches α (Fig. 3); the fraction of
the layer's expert assignments taken by its 4 most used experts and the normalised entropy of its
assignment distribution (Fig. 4; the per-token top-4 mass and entropy of softmax(r) in the JSON and
CSV as ``token_*``); mean experts per token (Fig. 5); tokens by frequency against active experts,
with the frequency histogram and the uniform expectation (Fig. 6); expert-load CV and MaxVio.
``--data`` may be repeated (``NAME=FILE``): every checkpoint is then analysed on every data set,
one run each ("checkpoint on data"), as Fig. 5 compares data sets. Writes ``analysis.json``,
``analysis.csv`` and PNG figures, and
``tokens.csv``: every token id seen ``--token-min-count`` times or more, ranked by the mean experts
it activates over layers and occurrences, the top and bottom 20% marked (the paper's
``tab:dynamic_expert_number``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

from . import common

CSV_FIELDS = ("run", "layer", "name", "tokens", "experts", "coverage_0.5", "coverage_0.9", "coverage_0.99",
              "assignment_top_mass", "assignment_entropy", "token_top_mass", "token_entropy", "cardinality_mean",
              "load_cv", "max_vio")
TOKEN_FIELDS = ("run", "rank", "token_id", "token", "count", "mean_experts", "group")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="probmoe-analyze", description="Routing analyses per layer (the ProbMoE "
                                "paper's Figs. 3-6, load balance) of checkpoints, side by side: JSON, CSV, PNG.")
    p.add_argument("--checkpoint", action="append", required=True, metavar="[NAME=]DIR",
                   help="a checkpoint directory, optionally named (repeat for side-by-side)")
    p.add_argument("--data", action="append", required=True, metavar="[NAME=]FILE",
                   help="records in any format of probmoe-train (.jsonl, .json, .parquet); the routing of the "
                   "whole texts is analysed (repeat, optionally named, to compare data sets)")
    common.add_data_format_flag(p)
    p.add_argument("--output", required=True, help="folder for analysis.json, analysis.csv and the figures")
    p.add_argument("--limit", type=common.positive_int, default=64, help="the first N records (default 64)")
    p.add_argument("--batch-size", type=common.positive_int, default=16)
    p.add_argument("--max-length", type=common.positive_int, default=1024)
    p.add_argument("--token-min-count", type=common.positive_int, default=3,
                   help="tokens.csv ranks token ids seen at least this often (default 3)")
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


def data_sets(specs: list[str]) -> dict[str, str]:
    """{name: file} from ``[NAME=]FILE`` arguments; the name defaults to the file's name without suffix."""
    sets = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or os.path.isfile(spec):
            name, path = os.path.splitext(os.path.basename(spec))[0], spec
        if name in sets:
            raise ValueError(f"--data: two data sets are named {name!r}; name them NAME=FILE")
        sets[name] = path
    return sets


def csv_rows(results: dict) -> list[dict]:
    rows = []
    for run, layers in results.items():
        for i, s in enumerate(layers):
            rows.append({"run": run, "layer": i, "name": s["name"], "tokens": s["tokens"], "experts": s["experts"],
                         **{f"coverage_{a}": s["coverage"][a] for a in ("0.5", "0.9", "0.99")},
                         **{key: s[key] for key in CSV_FIELDS[8:]}})
    return rows


def token_rows(run: str, layers, tokenizer, min_count: int) -> list[dict]:
    """tokens.csv's rows of one run: ids by mean experts (``metrics.token_ranking``), the first and
    last 20% (at least one each) grouped "top 20%" and "bottom 20%"; the token as decoded, escaped."""
    import torch

    from probmoe.analysis import metrics

    experts = torch.stack([metrics.cardinality(layer.selected) for layer in layers])  # [L, T]
    ids, counts, means = metrics.token_ranking(layers[0].token_ids, experts, min_count)
    edge = max(1, round(0.2 * len(ids)))
    return [{"run": run, "rank": rank, "token_id": int(i), "token": json.dumps(tokenizer.decode([int(i)]))[1:-1],
             "count": int(c), "mean_experts": round(float(m), 6),
             "group": "top 20%" if rank < edge else "bottom 20%" if rank >= len(ids) - edge else ""}
            for rank, (i, c, m) in enumerate(zip(ids, counts, means))]


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
        records = {name: formats.read(path, args.data_format).head(args.limit)
                   for name, path in data_sets(args.data).items()}
        common.check_output_folder(args.output, ("analysis.json", "analysis.csv", "tokens.csv"), args.overwrite)
        return runs, records, common.device(args.device), getattr(torch, args.dtype)

    runs, data_records, device, dtype = common.run_or_exit(p, body)
    from tqdm.auto import tqdm

    from probmoe.analysis import metrics, plots
    from probmoe.experiments import capture, checkpoints, data

    def progress(iterable, desc):
        return tqdm(iterable, desc=desc, disable=args.no_progress, dynamic_ncols=True)

    routing = dict(k=args.k, kmin=args.kmin, kmax=args.kmax, backend=args.backend, grad=args.grad)
    results, described, tokens = {}, {}, []
    for name, path in runs.items():
        model, tokenizer = common.run_or_exit(p, lambda: checkpoints.load(path, method=args.method, device=device,
                                                                           dtype=dtype, **routing))
        for data_name, records in data_records.items():
            run = name if len(data_records) == 1 else f"{name} on {data_name}"
            described[run] = checkpoints.describe(model)
            encoded = common.run_or_exit(p, lambda: data.encode_all(tokenizer, records, args.max_length))
            layers = capture.capture(model, tokenizer, encoded, args.batch_size, progress)
            results[run] = [dict(name=layer.name, **metrics.layer_summary(layer.probs, layer.selected, layer.token_ids))
                            for layer in layers]
            tokens += token_rows(run, layers, tokenizer, args.token_min_count)
    os.makedirs(args.output, exist_ok=True)  # only once every model has loaded and routed
    with open(os.path.join(args.output, "analysis.json"), "w", encoding="utf-8") as f:
        json.dump({"data": data_sets(args.data), "records": {name: len(r) for name, r in data_records.items()},
                   "format": {name: r.format for name, r in data_records.items()}, "routing": described,
                   "runs": results}, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.output, "analysis.csv"), "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(results))
    with open(os.path.join(args.output, "tokens.csv"), "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=TOKEN_FIELDS)
        writer.writeheader()
        writer.writerows(tokens)
    figures = plots.plot_all(results, args.output)
    for run, layers in results.items():
        cover = ", ".join(f"{s['coverage']['0.9']:.2f}" for s in layers)
        card = ", ".join(f"{s['cardinality_mean']:.2f}" for s in layers)
        top = ", ".join(f"{s['assignment_top_mass']:.2f}" for s in layers)
        print(f"{run} [{described[run]}]: experts to cover 90% per layer {cover}; top-4 assignment mass {top}; "
              f"experts per token {card}")
        ranked = [row for row in tokens if row["run"] == run]
        if ranked:
            quoted = [f"'{r['token']}' ({r['mean_experts']:.2f})" for r in ranked]  # token: escaped already
            print(f"  most experts: {', '.join(quoted[:5])}; fewest: {', '.join(quoted[-5:])}")
    print(f"{len(figures)} figures, analysis.json, analysis.csv and tokens.csv in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
