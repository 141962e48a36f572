"""``probmoe-eval --tasks``: LM Evaluation Harness tasks on a checkpoint (``probmoe.eval.harness``).

    probmoe-eval --checkpoint runs/a --tasks mmlu --batch-size 8
    probmoe-eval --checkpoint runs/a --tasks mbpp --allow-code-execution --method probmoe-dynamic --kmin 4 --kmax 8
    probmoe-eval --checkpoint runs/a --tasks my_task --include-path my_tasks/

Writes ``results.json`` (the harness's results: metrics, task configs, versions), ``routing.json``
(experts per token per MoE layer over the tokens the model read and wrote) and, with
``--log-samples``, ``samples_<task>.jsonl`` into ``--output`` (default ``<checkpoint>/tasks-<method>``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from probmoe.experiments import config_parser, options


def main(p: argparse.ArgumentParser, cfg) -> int:
    """``cfg``: the ``EvalConfig`` of a ``probmoe-eval --tasks`` command line."""
    if importlib.util.find_spec("lm_eval") is None:
        p.error("--tasks needs the LM Evaluation Harness: pip install 'probmoe[eval]'")

    def body(unreachable):
        from probmoe.eval import harness
        from probmoe.experiments import checkpoints

        tasks = harness.parse_tasks(cfg.tasks)
        checkpoints.check(cfg.checkpoint)
        manager = harness.task_manager(tasks, cfg.include_path)
        out = cfg.output or os.path.join(cfg.checkpoint, f"tasks-{cfg.routing.method or 'saved'}")
        options.check_output_folder(out, harness.FILES, cfg.overwrite)
        harness.check_data(tasks, manager, unreachable)  # offline: the data from the cache, or one line now
        lm = harness.ProbMoELM(
            cfg.checkpoint,
            **config_parser.section_values(cfg, "routing"),  # method, k, kmin, kmax, algorithm, grad
            device=options.device(cfg.device),
            dtype=cfg.dtype,
            batch_size=cfg.batch_size,
            progress=cfg.progress,
        )
        os.makedirs(out, exist_ok=True)  # only once the model has loaded
        return tasks, manager, out, lm

    from probmoe.experiments import interrupts

    def run() -> int:
        from probmoe.eval import harness

        with harness.offline_when_unreachable() as unreachable:  # no minute of retries without a network
            tasks, manager, out, lm = options.run_or_exit(p, lambda: body(unreachable))
            results = options.run_or_exit(p, lambda: _evaluate(harness, lm, tasks, manager, cfg))
        with interrupts.deferred():  # the files written whole
            lines = harness.write_results(out, results)
        for line in lines:
            print(line)
        print(f"results in {out}", file=sys.stderr)
        return interrupts.after_writing("the results", out)

    # the harness writes its results only at the end: a signal before then leaves nothing
    return interrupts.run_or_end(run, f"running {cfg.tasks} on {cfg.checkpoint}", lambda: "nothing was written")


def _evaluate(harness, lm, tasks, manager, cfg) -> dict:
    """``harness.evaluate``; a task whose data cannot be downloaded is a ValueError saying why."""
    try:
        return harness.evaluate(
            lm,
            tasks,
            manager,
            limit=cfg.limit,
            num_fewshot=cfg.num_fewshot,
            allow_code_execution=cfg.allow_code_execution,
            log_samples=cfg.log_samples,
            seed=cfg.seed,
        )
    except ConnectionError as e:  # datasets' "Couldn't reach 'cais/mmlu' on the Hub"
        raise ValueError(
            f"--tasks {cfg.tasks}: the harness could not download a task's data ({e}); it fetches it "
            "from the Hugging Face Hub on first use and caches it: run once with network access, or "
            "with HF_DATASETS_OFFLINE=1 where the cache has it"
        ) from None
