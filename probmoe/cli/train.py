"""``probmoe-train``: fine-tune an MoE model with any routing method of the paper's comparison.

    probmoe-train --model tiny-olmoe --data ../shared/data/gsm8k/train.jsonl --output-dir runs/a \\
        --method probmoe --max-steps 200
    probmoe-train --config run.yaml --lr 3e-4              # the file's options, --lr overridden
    torchrun --nproc_per_node 2 -m probmoe.cli.train ...     (the same flags, DDP)
    torchrun --nproc_per_node 8 -m probmoe.cli.train --model olmoe-1b-7b-shape ... --fsdp --bf16
    probmoe-launch --nproc_per_node 2 -m probmoe.cli.train ...   (torchrun; Ctrl-C: 130)
    probmoe-train --model olmoe-1b-7b-shape --plan --world-size 8 ...   (memory per GPU; loads nothing)

The options are ``probmoe.experiments.run_config.TrainConfig``'s fields; the resolved ones are
written to ``<output-dir>/config.yaml``. See docs/experiments.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from probmoe.experiments import config_parser, interrupts, options
from probmoe.experiments.run_config import TrainConfig

from . import common


def parser() -> argparse.ArgumentParser:
    return config_parser.parser(
        TrainConfig,
        "probmoe-train",
        "Fine-tune a transformers MoE model (OLMoE, Qwen2-MoE, "
        "Qwen3-MoE, Mixtral, FlexOlmo, DeepSeek-V3) on instruction data (question/answer, prompt/"
        "completion, chat messages or plain text) with ProbMoE or a baseline router. Runs "
        "alone or under torchrun (DDP, or FSDP2 with --fsdp).",
    )


def plan(p: argparse.ArgumentParser, cfg: TrainConfig) -> int:
    """``--plan``: the memory table for the options given; nothing is loaded."""
    from probmoe.experiments import memory_plan

    def body():
        world = cfg.run.world_size or int(os.environ.get("WORLD_SIZE", "1"))
        cfg.optim.batch_size = memory_plan.per_process_batch(cfg.optim, world)
        shape, kwargs = memory_plan.for_run(cfg, world, cfg.run.device or "cuda")
        return memory_plan.report(cfg.model.name, shape, world_size=world, **kwargs)

    print(options.run_or_exit(p, body))
    return 0


def main(argv=None) -> int:
    cfg = trainer = None
    with interrupts.catch():  # from the first line: a signal while the libraries load is one line too
        try:
            p = parser()
            cfg = config_parser.parse(TrainConfig, p, argv)
            common.require_extras(p)
            common.quiet_progress(not cfg.run.progress)
            if cfg.run.plan:
                return plan(p, cfg)
            if cfg.data.path is None or cfg.run.output_dir is None:
                p.error("the following arguments are required: --data, --output-dir (all but --plan)")
            trainer = options.run_or_exit(p, lambda: _trainer(cfg))
            return _train(cfg, trainer)
        except interrupts.Interrupted as e:  # one line and 128 + the signal's number, no traceback
            return interrupts.report(e, cfg and cfg.run.output_dir)
        finally:  # the output folder is let go once the run has written all it writes (run_lock)
            if trainer is not None:
                trainer.close()


def _trainer(cfg: TrainConfig):
    """The ``Trainer`` of ``cfg``, once the checks that need no model have passed."""
    from probmoe.experiments import tracking
    from probmoe.experiments.trainer import Trainer
    from probmoe.integrations import final_model
    from probmoe.integrations.transformers.weights_file import check_weights_files

    tracking.check(cfg.run.report_to, cfg.run.output_dir)
    if os.path.isdir(cfg.model.name):  # a checkpoint, e.g. another run's final model
        check_weights_files(cfg.model.name)  # the headers first: what they find is said more precisely
        final_model.verify(cfg.model.name)
    return Trainer(cfg)


def _train(cfg: TrainConfig, trainer) -> int:
    """The run once the ``Trainer`` is built: notes, the config file and tracker, the loop."""
    from probmoe.experiments import distributed, tracking

    if trainer.nothing_to_do is not None:
        if trainer.world.main:
            print(trainer.nothing_to_do, file=sys.stderr)
        distributed.teardown()
        return 0
    if trainer.world.main:
        if trainer.no_answer:
            print(
                f"warning: --max-length {cfg.data.max_length} leaves no answer token in {trainer.no_answer} of "
                f"{len(trainer.encoded)} examples; they add nothing to the loss (raise --max-length to keep them)",
                file=sys.stderr,
            )
        if trainer.repair is not None:
            print(
                f"the final model in {cfg.run.output_dir} is damaged ({trainer.repair}); writing it again from "
                f"{trainer.resume_dir}",
                file=sys.stderr,
            )
        elif trainer.resume_dir is not None:
            print(f"resumed from {trainer.resume_dir} at step {trainer.step} of {trainer.total_steps}", file=sys.stderr)
        os.makedirs(cfg.run.output_dir, exist_ok=True)
        config_parser.write(cfg, os.path.join(cfg.run.output_dir, "config.yaml"))
        trainer.tracker = tracking.start(
            cfg.run.report_to, cfg.run.output_dir, config_parser.as_file(cfg), trainer.net, trainer.step
        )
    try:
        last = trainer.run()
    finally:
        if trainer.tracker is not None:
            trainer.tracker.close()
    if trainer.world.main and trainer.repair is not None:
        print(f"final model in {cfg.run.output_dir}, written again from {trainer.resume_dir}", file=sys.stderr)
    if trainer.world.main and last:
        where = (
            f"model in {cfg.run.output_dir}"
            if trainer.step == trainer.total_steps
            else f"stopped at step {trainer.step} of {trainer.total_steps}: resume with --resume latest"
        )
        print(f"step {last['step']}: loss {last['loss']:.4f}; {where}", file=sys.stderr)
    distributed.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
