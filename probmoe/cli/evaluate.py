"""``probmoe-eval``: GSM8K exact match (greedy generation) and answer loss of a checkpoint.

    probmoe-eval --checkpoint runs/a --data ../shared/data/gsm8k/test.jsonl --limit 200
    probmoe-eval --checkpoint runs/a --method probmoe-dynamic --kmin 1 --kmax 8   # another inference rule
    probmoe-eval --checkpoint runs/a --tasks mmlu,mbpp ...   # LM Evaluation Harness tasks (evaluate_tasks)

Prints the scores and writes ``results.jsonl`` (one line per problem) and ``summary.json`` into
``--output`` (default: ``<checkpoint>/eval-<method>``, ``eval-saved`` for the saved routing). The
work is ``probmoe.eval.generation.evaluate``.
"""

from __future__ import annotations

import argparse
import os
import sys

from probmoe.experiments import config_parser, interrupts, options
from probmoe.experiments.run_config import EvalConfig

from . import common, evaluate_tasks

FILES = ("results.jsonl", "summary.json")


def parser() -> argparse.ArgumentParser:
    return config_parser.parser(
        EvalConfig,
        "probmoe-eval",
        "GSM8K exact match with greedy generation, and the loss "
        "on the reference answers, of a checkpoint written by probmoe-train (or any local "
        "transformers MoE checkpoint); or LM Evaluation Harness tasks (--tasks).",
    )


def main(argv=None) -> int:
    # from the first line: a signal while the libraries load is one line too
    return interrupts.run_or_end(lambda: _main(argv), "starting", lambda: "nothing was written")


def _main(argv) -> int:
    p = parser()
    cfg = config_parser.parse(EvalConfig, p, argv)
    common.require_extras(p)
    common.quiet_progress(not cfg.progress)
    if (cfg.data is None) == (cfg.tasks is None):
        p.error("give either --data (GSM8K exact match) or --tasks (LM Evaluation Harness tasks)")
    if cfg.tasks is not None:
        given = [
            flag
            for flag, value in (
                ("--max-new-tokens", cfg.max_new_tokens),
                ("--max-length", cfg.max_length),
                ("--skip-generation", cfg.skip_generation or None),
            )
            if value is not None
        ]
        if given:
            p.error(
                f"{', '.join(given)} apply to --data (GSM8K) only; with --tasks the harness's task settings "
                "decide generation lengths"
            )
        return evaluate_tasks.main(p, cfg)
    cfg.max_new_tokens = cfg.max_new_tokens or 256
    cfg.max_length = cfg.max_length or 1024
    out = cfg.output or os.path.join(cfg.checkpoint, f"eval-{cfg.routing.method or 'saved'}")
    started = []  # the problems, once the evaluation has started writing into ``out``
    return interrupts.run_or_end(
        lambda: _evaluate(p, cfg, out, started), f"evaluating {cfg.checkpoint}", lambda: _written(out, started)
    )


def _evaluate(p: argparse.ArgumentParser, cfg: EvalConfig, out: str, started: list) -> int:
    def body():
        import torch

        from probmoe.eval import gsm8k
        from probmoe.experiments import checkpoints, formats

        records = formats.read(cfg.data, "question-answer").head(cfg.limit)
        if not cfg.skip_generation:
            gsm8k.check_references(records)
        records = records.rows
        checkpoints.check(cfg.checkpoint)
        options.check_output_folder(out, FILES, cfg.overwrite)
        model, tokenizer = checkpoints.load(
            cfg.checkpoint,
            routing=cfg.routing,
            device=options.device(cfg.device),
            dtype=getattr(torch, cfg.dtype),
        )
        os.makedirs(out, exist_ok=True)  # only once the model has loaded
        return records, model, tokenizer

    records, model, tokenizer = options.run_or_exit(p, body)
    from probmoe.eval import generation
    from probmoe.experiments import checkpoints

    for name in FILES:  # --overwrite: an interrupted run leaves no earlier run's files beside its own
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    started.append(len(records))
    try:
        summary = generation.evaluate(
            model,
            tokenizer,
            records,
            out,
            batch_size=cfg.batch_size,
            max_length=cfg.max_length,
            max_new_tokens=cfg.max_new_tokens,
            generate=not cfg.skip_generation,
            progress=common.progress_bar(cfg.progress),
            about={"checkpoint": cfg.checkpoint, "data": cfg.data, "routing": checkpoints.describe(model)},
        )
    except Exception:  # a failure (not a signal: interrupts.ended says what is there) leaves no partial results
        started.clear()
        for name in FILES:
            if os.path.exists(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
        raise
    line = (
        f"{summary['routing']}: answer loss {summary['answer_loss']:.4f}, {summary['experts_per_token']:.2f} "
        f"experts/token"
    )
    if not cfg.skip_generation and records:
        line += (
            f", exact match {summary['exact_match_flexible']:.2%} (flexible), "
            f"{summary['exact_match_strict']:.2%} (strict) on {len(records)} problems"
        )
    print(line)
    print(f"results in {out}", file=sys.stderr)
    return 0


def _written(out: str, started: list) -> str:
    """What an interrupted evaluation left in ``out``."""
    if not started:
        return "nothing was written"
    path = os.path.join(out, "results.jsonl")
    done = sum(1 for _ in open(path, encoding="utf-8")) if os.path.exists(path) else 0
    return (
        f"{path} holds {done} of the {started[0]} problems and there is no summary.json: run the same command "
        "with --overwrite to evaluate them all"
    )


if __name__ == "__main__":
    sys.exit(main())
