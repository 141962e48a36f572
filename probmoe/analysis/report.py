"""``probmoe-analyze``'s files: ``analysis.json``, ``analysis.csv``, ``tokens.csv`` and the figures.

``results`` is {run: [per-layer dict: "name" and ``metrics.layer_summary``'s fields]}; ``tokens``
the rows of ``token_rows`` over every run.
"""

from __future__ import annotations

import csv
import json
import os

from . import metrics, plots

CSV_FIELDS = (
    "run",
    "layer",
    "name",
    "tokens",
    "experts",
    "coverage_0.5",
    "coverage_0.9",
    "coverage_0.99",
    "assignment_top_mass",
    "assignment_entropy",
    "token_top_mass",
    "token_entropy",
    "cardinality_mean",
    "load_cv",
    "max_vio",
)
TOKEN_FIELDS = ("run", "rank", "token_id", "token", "count", "mean_experts", "group")
FILES = ("analysis.json", "analysis.csv", "tokens.csv")


def csv_rows(results: dict) -> list[dict]:
    """analysis.csv's rows: one per run and layer."""
    rows = []
    for run, layers in results.items():
        for i, s in enumerate(layers):
            rows.append(
                {
                    "run": run,
                    "layer": i,
                    "name": s["name"],
                    "tokens": s["tokens"],
                    "experts": s["experts"],
                    **{f"coverage_{a}": s["coverage"][a] for a in ("0.5", "0.9", "0.99")},
                    **{key: s[key] for key in CSV_FIELDS[8:]},
                }
            )
    return rows


def token_rows(run: str, layers, decode, min_count: int) -> list[dict]:
    """tokens.csv's rows of one run (``layers``: per MoE layer, ``.selected`` [T, N] bool and
    ``.token_ids`` [T]): ids by mean experts (``metrics.token_ranking``), the first and last 20% (at
    least one each) grouped "top 20%" and "bottom 20%"; the token as ``decode([id])`` writes it, escaped."""
    import torch

    experts = torch.stack([metrics.cardinality(layer.selected) for layer in layers])  # [L, T]
    ids, counts, means = metrics.token_ranking(layers[0].token_ids, experts, min_count)
    edge = max(1, round(0.2 * len(ids)))
    return [
        {
            "run": run,
            "rank": rank,
            "token_id": int(i),
            "token": json.dumps(decode([int(i)]))[1:-1],
            "count": int(c),
            "mean_experts": round(float(m), 6),
            "group": "top 20%" if rank < edge else "bottom 20%" if rank >= len(ids) - edge else "",
        }
        for rank, (i, c, m) in enumerate(zip(ids, counts, means))
    ]


def write(out: str, results: dict, tokens: list[dict], about: dict) -> list[str]:
    """analysis.json (``about``, e.g. the data and routing, then "runs": ``results``), analysis.csv,
    tokens.csv and the figures into ``out`` (created); returns the figures' paths."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "analysis.json"), "w", encoding="utf-8") as f:
        json.dump({**about, "runs": results}, f, indent=1)
        f.write("\n")
    for name, fieldnames, rows in (
        ("analysis.csv", CSV_FIELDS, csv_rows(results)),
        ("tokens.csv", TOKEN_FIELDS, tokens),
    ):
        with open(os.path.join(out, name), "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(rows)
    return plots.plot_all(results, out)


def summary_lines(results: dict, tokens: list[dict], described: dict) -> list[str]:
    """What ``probmoe-analyze`` prints per run: coverage, top-4 mass and experts per token by layer,
    and the tokens that take the most and fewest experts."""
    lines = []
    for run, layers in results.items():
        cover = ", ".join(f"{s['coverage']['0.9']:.2f}" for s in layers)
        card = ", ".join(f"{s['cardinality_mean']:.2f}" for s in layers)
        top = ", ".join(f"{s['assignment_top_mass']:.2f}" for s in layers)
        lines.append(
            f"{run} [{described[run]}]: experts to cover 90% per layer {cover}; top-4 assignment mass {top}; "
            f"experts per token {card}"
        )
        ranked = [row for row in tokens if row["run"] == run]
        if ranked:
            quoted = [f"'{r['token']}' ({r['mean_experts']:.2f})" for r in ranked]  # token: escaped already
            lines.append(f"  most experts: {', '.join(quoted[:5])}; fewest: {', '.join(quoted[-5:])}")
    return lines
