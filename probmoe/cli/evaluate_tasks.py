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
import json
import os
import sys

from . import common

FILES = ("results.json", "routing.json")


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LM Evaluation Harness (pip install 'probmoe[eval]')")
    g.add_argument("--tasks", help="comma-separated harness task or group names (mmlu, mbpp, ...); instead of --data")
    g.add_argument("--include-path", help="a folder of your own task YAML (the harness's --include_path)")
    g.add_argument("--num-fewshot", type=common.nonnegative_int, help="few-shot examples (default: each task's own)")
    g.add_argument("--allow-code-execution", action="store_true", help="run the generated code of tasks the "
                   "harness marks unsafe (MBPP, HumanEval): its --confirm_run_unsafe_code and HF_ALLOW_CODE_EVAL=1")
    g.add_argument("--log-samples", action="store_true", help="also write every request and response, per task")
    g.add_argument("--seed", type=common.nonnegative_int, default=0, help="the harness's seeds (few-shot order)")


def _write_json(path: str, value) -> None:
    from lm_eval.utils import handle_non_serializable

    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, default=handle_non_serializable, ensure_ascii=False)
        f.write("\n")


def main(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if importlib.util.find_spec("lm_eval") is None:
        p.error("--tasks needs the LM Evaluation Harness: pip install 'probmoe[eval]'")
    def body():
        from probmoe.eval import harness
        from probmoe.experiments import checkpoints

        tasks = harness.parse_tasks(args.tasks)
        checkpoints.check(args.checkpoint)
        manager = harness.task_manager(tasks, args.include_path)
        out = args.output or os.path.join(args.checkpoint, f"tasks-{args.method or 'saved'}")
        common.check_output_folder(out, FILES, args.overwrite)
        lm = harness.ProbMoELM(args.checkpoint, method=args.method, k=args.k, kmin=args.kmin, kmax=args.kmax,
                               backend=args.backend, grad=args.grad, device=common.device(args.device),
                               dtype=args.dtype, batch_size=args.batch_size)
        os.makedirs(out, exist_ok=True)  # only once the model has loaded
        return tasks, manager, out, lm

    tasks, manager, out, lm = common.run_or_exit(p, body)
    from probmoe.eval import harness

    results = common.run_or_exit(p, lambda: harness.evaluate(
        lm, tasks, manager, limit=args.limit, num_fewshot=args.num_fewshot,
        allow_code_execution=args.allow_code_execution, log_samples=args.log_samples, seed=args.seed))
    samples = results.pop("samples", {})
    routing = results.pop("probmoe")
    _write_json(os.path.join(out, "results.json"), results)
    _write_json(os.path.join(out, "routing.json"), routing)
    for task, rows in samples.items():
        from lm_eval.utils import handle_non_serializable

        with open(os.path.join(out, f"samples_{task}.jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, default=handle_non_serializable, ensure_ascii=False) + "\n")
    stats = routing["routing_statistics"]
    for task, values in results["results"].items():
        metric = harness.headline(values)
        if metric is not None:
            print(f"{task}: {metric[0]} {metric[1]:.4f}")
    per_layer = ", ".join(f"{layer['experts_per_token']:.2f}" for layer in stats["layers"])
    print(f"{routing['routing']}: {stats['experts_per_token']:.3f} experts/token over {stats['tokens']} tokens "
          f"(per layer {per_layer})")
    print(f"results in {out}", file=sys.stderr)
    return 0
