"""``probmoe-eval``: GSM8K exact match (greedy generation) and answer loss of a checkpoint.

    probmoe-eval --checkpoint runs/a --data ../shared/data/gsm8k/test.jsonl --limit 200
    probmoe-eval --checkpoint runs/a --method probmoe-dynamic --kmin 1 --kmax 8   # another inference rule

Prints the scores and writes ``results.jsonl`` (one line per problem) and ``summary.json`` into
``--output`` (default: ``<checkpoint>/eval``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import common


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="probmoe-eval", description="GSM8K exact match with greedy generation, and "
                                "the loss on the reference answers, of a checkpoint written by probmoe-train (or "
                                "any local transformers MoE checkpoint).")
    p.add_argument("--checkpoint", required=True, help="a checkpoint directory")
    p.add_argument("--data", required=True, help="JSON lines with 'question' and 'answer' (GSM8K test set)")
    p.add_argument("--limit", type=common.positive_int, help="the first N problems only")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=256)
    p.add_argument("--batch-size", type=common.positive_int, default=16)
    p.add_argument("--max-length", type=common.positive_int, default=1024, help="tokens per example for the loss")
    p.add_argument("--output", help="results folder (default: <checkpoint>/eval)")
    p.add_argument("--skip-generation", action="store_true", help="only the answer loss")
    common.add_routing_flags(p, required=False)
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: CUDA when present")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)

    def body():
        import torch

        from probmoe.experiments import checkpoints, data

        records = data.read_jsonl(args.data)[:args.limit]
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        routing = dict(k=args.k, kmin=args.kmin, kmax=args.kmax, backend=args.backend, grad=args.grad)
        model, tokenizer = checkpoints.load(args.checkpoint, method=args.method, device=device, **routing)
        return records, model, tokenizer

    records, model, tokenizer = common.run_or_exit(p, body)
    from tqdm.auto import tqdm

    from probmoe.experiments import checkpoints, generation

    def progress(iterable, desc):
        return tqdm(iterable, desc=desc, disable=args.no_progress, dynamic_ncols=True)

    summary = {"checkpoint": args.checkpoint, "data": args.data, "routing": checkpoints.describe(model),
               "problems": len(records)}
    summary.update(generation.answer_loss(model, tokenizer, records, args.batch_size, args.max_length, progress))
    results = []
    if not args.skip_generation:
        for start in progress(range(0, len(records), args.batch_size), desc="generate"):
            chunk = records[start:start + args.batch_size]
            completions = generation.complete(model, tokenizer, [r["question"] for r in chunk], args.max_new_tokens)
            results += [dict(index=start + i, **generation.score(r, c)) for i, (r, c) in enumerate(zip(chunk, completions))]
        for mode in ("flexible", "strict"):
            summary[f"exact_match_{mode}"] = sum(r[f"correct_{mode}"] for r in results) / len(results)
    out = args.output or os.path.join(args.checkpoint, "eval")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.jsonl"), "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    line = f"{summary['routing']}: answer loss {summary['answer_loss']:.4f}, {summary['experts_per_token']:.2f} " \
           f"experts/token"
    if results:
        line += f", exact match {summary['exact_match_flexible']:.2%} (flexible), " \
                f"{summary['exact_match_strict']:.2%} (strict) on {len(results)} problems"
    print(line)
    print(f"results in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
