"""``probmoe-eval``: GSM8K exact match (greedy generation) and answer loss of a checkpoint.

    probmoe-eval --checkpoint runs/a --data ../shared/data/gsm8k/test.jsonl --limit 200
    probmoe-eval --checkpoint runs/a --method probmoe-dynamic --kmin 1 --kmax 8   # another inference rule
    probmoe-eval --checkpoint runs/a --tasks mmlu,mbpp ...   # LM Evaluation Harness tasks (evaluate_tasks)

Prints the scores and writes ``results.jsonl`` (one line per problem) and ``summary.json`` into
``--output`` (default: ``<checkpoint>/eval-<method>``, ``eval-saved`` for the saved routing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import common, evaluate_tasks


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="probmoe-eval", description="GSM8K exact match with greedy generation, and "
                                "the loss on the reference answers, of a checkpoint written by probmoe-train (or "
                                "any local transformers MoE checkpoint).")
    p.add_argument("--checkpoint", required=True, help="a checkpoint directory")
    p.add_argument("--data", help="records with 'question' and 'answer' (GSM8K test set): .jsonl, .json or "
                   ".parquet; or --tasks")
    p.add_argument("--limit", type=common.positive_int, help="the first N problems (of each task) only")
    p.add_argument("--max-new-tokens", type=common.positive_int, help="GSM8K: tokens generated per answer (default 256)")
    p.add_argument("--batch-size", type=common.positive_int, default=16)
    p.add_argument("--max-length", type=common.positive_int, help="GSM8K: tokens per example for the loss "
                   "(default 1024)")
    p.add_argument("--output", help="results folder (default: <checkpoint>/eval-<method>, eval-saved for the "
                   "routing saved with the checkpoint)")
    p.add_argument("--skip-generation", action="store_true", help="GSM8K: only the answer loss")
    common.add_routing_flags(p, required=False)
    common.add_model_flags(p)
    evaluate_tasks.add_flags(p)
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    common.require_extras(p)
    common.quiet_progress(args.no_progress)
    if (args.data is None) == (args.tasks is None):
        p.error("give either --data (GSM8K exact match) or --tasks (LM Evaluation Harness tasks)")
    if args.tasks is not None:
        given = [flag for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--max-length", args.max_length),
                                          ("--skip-generation", args.skip_generation or None)) if value is not None]
        if given:
            p.error(f"{', '.join(given)} apply to --data (GSM8K) only; with --tasks the harness's task settings "
                    "decide generation lengths")
        return evaluate_tasks.main(p, args)
    args.max_new_tokens = args.max_new_tokens or 256
    args.max_length = args.max_length or 1024

    def body():
        import torch

        from probmoe.experiments import checkpoints, formats

        records = formats.read(args.data, "question-answer").head(args.limit).rows
        checkpoints.check(args.checkpoint)
        out = args.output or os.path.join(args.checkpoint, f"eval-{args.method or 'saved'}")
        common.check_output_folder(out, ("results.jsonl", "summary.json"), args.overwrite)
        routing = dict(k=args.k, kmin=args.kmin, kmax=args.kmax, backend=args.backend, grad=args.grad)
        model, tokenizer = checkpoints.load(args.checkpoint, method=args.method, device=common.device(args.device),
                                            dtype=getattr(torch, args.dtype), **routing)
        os.makedirs(out, exist_ok=True)  # only once the model has loaded
        return records, out, model, tokenizer

    records, out, model, tokenizer = common.run_or_exit(p, body)
    from tqdm.auto import tqdm

    from probmoe.experiments import checkpoints, generation

    def progress(iterable, desc):
        return tqdm(iterable, desc=desc, disable=args.no_progress, dynamic_ncols=True)

    summary = {"checkpoint": args.checkpoint, "data": args.data, "routing": checkpoints.describe(model),
               "problems": len(records)}
    summary.update(generation.answer_loss(model, tokenizer, records, args.batch_size, args.max_length, progress))
    results = []
    with open(os.path.join(out, "results.jsonl"), "w", encoding="utf-8") as f:  # written as it goes
        for start in progress(range(0, len(records), args.batch_size) if not args.skip_generation else [],
                              desc="generate"):
            chunk = records[start:start + args.batch_size]
            completions = generation.complete(model, tokenizer, [r["question"] for r in chunk], args.max_new_tokens)
            for i, (record, completion) in enumerate(zip(chunk, completions)):
                results.append(dict(index=start + i, **generation.score(record, completion)))
                f.write(json.dumps(results[-1]) + "\n")
            f.flush()
    if results:
        for mode in ("flexible", "strict"):
            summary[f"exact_match_{mode}"] = sum(r[f"correct_{mode}"] for r in results) / len(results)
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
