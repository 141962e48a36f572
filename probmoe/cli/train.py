"""``probmoe-train``: fine-tune an MoE model with any routing method of the paper's comparison.

    probmoe-train --model tiny-olmoe --data ../shared/data/gsm8k/train.jsonl --output-dir runs/a \\
        --method probmoe --max-steps 200
    torchrun --nproc_per_node 2 -m probmoe.cli.train ...     (the same flags, DDP)
    torchrun --nproc_per_node 8 -m probmoe.cli.train --model olmoe-1b-7b-shape ... --fsdp --bf16
    probmoe-train --model olmoe-1b-7b-shape --plan --world-size 8 ...   (memory per GPU; loads nothing)

See docs/experiments.md.
"""

from __future__ import annotations

import argparse
import sys

from . import common


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="probmoe-train", description="Fine-tune a transformers MoE model "
                                "(OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V3) on instruction data (question/answer, "
                                "prompt/completion, chat messages or plain text) with ProbMoE or a baseline router. "
                                "Runs alone or under torchrun (DDP, or FSDP2 with --fsdp).")
    p.add_argument("--model", required=True, help="tiny-olmoe, tiny-qwen2-moe, tiny-qwen3-moe, tiny-mixtral, "
                   "tiny-deepseek-v3 (randomly initialised, byte-level tokenizer), or a local checkpoint directory "
                   "of those families")
    p.add_argument("--data", help=".jsonl, .json or .parquet records: question/answer (GSM8K), "
                   "prompt/completion, messages (chat template) or text")
    common.add_data_format_flag(p)
    p.add_argument("--output-dir", help="checkpoints, the final model and train_log.jsonl")
    common.add_routing_flags(p, required=False)
    p.add_argument("--aux-loss", type=common.nonnegative_float, default=None,
                   help="load-balancing loss coefficient (default: the model config's router_aux_loss_coef)")
    p.add_argument("--z-loss", type=common.nonnegative_float, default=None,
                   help="router z-loss coefficient (default: the config's router_z_loss_coef, or 0)")
    p.add_argument("--l1-coef", type=common.positive_float, default=None,
                   help="remoe: initial L1 coefficient λ0 of the ReLU gates (default 1e-8, the paper's)")
    p.add_argument("--l1-rate", type=common.positive_float, default=None,
                   help="remoe: factor (> 1) λ is multiplied or divided by after each step to steer the mean "
                   "number of active experts to the model's top-k (default 1.2)")
    p.add_argument("--balance", choices=("none", "aux-free"), default="none",
                   help="aux-free: DeepSeek-V3's auxiliary-loss-free balancing, a per-expert bias on the selection "
                   "scores updated after each step (not for sparsemixer, remoe)")
    p.add_argument("--balance-rate", type=common.positive_float, default=None,
                   help="aux-free: the bias step γ (default 1e-3)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--max-steps", type=common.positive_int, help="optimizer steps in all")
    length.add_argument("--epochs", type=common.positive_float, help="passes over the data (default 1)")
    p.add_argument("--lr", type=common.positive_float, default=1e-3, help="peak learning rate (AdamW)")
    p.add_argument("--lr-schedule", choices=("constant", "linear", "cosine"), default="linear")
    p.add_argument("--warmup-steps", type=common.nonnegative_int, default=0)
    p.add_argument("--weight-decay", type=common.nonnegative_float, default=0.0)
    p.add_argument("--max-grad-norm", type=common.nonnegative_float, default=1.0, help="0: no clipping")
    p.add_argument("--batch-size", type=common.positive_int, default=8, help="examples per process per micro-batch")
    p.add_argument("--grad-accum", type=common.positive_int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--max-length", type=common.positive_int, default=1024, help="tokens per example, at most")
    p.add_argument("--seed", type=common.nonnegative_int, default=0)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--resume", help="a checkpoint directory, or 'latest' (the newest in --output-dir)")
    p.add_argument("--stop-after", type=common.positive_int,
                   help="stop after this step with a resumable checkpoint, the schedule unchanged")
    p.add_argument("--save-every", type=common.nonnegative_int, default=0,
                   help="write a resumable checkpoint every N steps (0: only at the end)")
    p.add_argument("--log-every", type=common.positive_int, default=1)
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: CUDA when present")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (ours, transformers', datasets')")
    big = p.add_argument_group("large models (docs/experiments.md, \"the paper's OLMoE run on 8 GPUs\")")
    big.add_argument("--fsdp", action="store_true", help="shard every decoder layer over the processes with FSDP2 "
                     "(under torchrun); with --bf16: bf16 compute, fp32 gradient reduction")
    big.add_argument("--param-dtype", choices=("float32", "bfloat16"), default="float32",
                     help="dtype the parameters and AdamW state are stored in (a checkpoint loads straight into it)")
    big.add_argument("--layers", type=common.positive_int, help="decoder layers of a built-in model (default: "
                     "its own); e.g. olmoe-1b-7b-shape at its real widths and reduced depth")
    big.add_argument("--global-batch-size", type=common.positive_int,
                     help="examples per optimizer step over all processes (replaces --batch-size: must divide by "
                     "processes x --grad-accum)")
    big.add_argument("--plan", action="store_true", help="print the per-GPU memory under DDP and FSDP and which "
                     "GPU sizes fit, then exit (no weights, no data)")
    big.add_argument("--world-size", type=common.positive_int, help="processes for --plan (default: WORLD_SIZE or 1)")
    return p


def plan(p: argparse.ArgumentParser, args) -> int:
    """``--plan``: the memory table for the flags given; nothing is loaded."""
    import os

    from probmoe.experiments import memory_plan
    from probmoe.experiments.trainer import TrainConfig

    def body():
        world = args.world_size or int(os.environ.get("WORLD_SIZE", "1"))
        batch = args.batch_size if args.global_batch_size is None else \
            memory_plan.per_process_batch(args.global_batch_size, world, args.grad_accum)
        cfg = TrainConfig(model=args.model, data="", output_dir="", method=args.method or "probmoe", k=args.k,
                          kmax=args.kmax, batch_size=batch, max_length=args.max_length, bf16=args.bf16,
                          gradient_checkpointing=args.gradient_checkpointing, param_dtype=args.param_dtype,
                          layers=args.layers)
        shape, kwargs = memory_plan.for_run(cfg, world, args.device or "cuda")
        return memory_plan.report(args.model, shape, world_size=world, **kwargs)

    print(common.run_or_exit(p, body))
    return 0


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    common.require_extras(p)
    common.quiet_progress(args.no_progress)
    if args.plan:
        return plan(p, args)
    if args.data is None or args.output_dir is None:
        p.error("the following arguments are required: --data, --output-dir (all but --plan)")

    def body():
        import os

        from probmoe.experiments.trainer import TrainConfig, Trainer
        from probmoe.integrations.transformers.weights_file import check_weights_files

        if os.path.isdir(args.model):
            check_weights_files(args.model)
        cfg = TrainConfig(model=args.model, data=args.data, output_dir=args.output_dir, data_format=args.data_format,
                          method=args.method or "probmoe", k=args.k, kmin=args.kmin, kmax=args.kmax,
                          backend=args.backend, grad=args.grad, aux_loss=args.aux_loss, z_loss=args.z_loss,
                          l1_coef=args.l1_coef, l1_rate=args.l1_rate,
                          balance=None if args.balance == "none" else args.balance, balance_rate=args.balance_rate,
                          max_steps=args.max_steps,
                          epochs=None if args.max_steps else (args.epochs or 1.0), lr=args.lr, lr_schedule=args.lr_schedule,
                          warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
                          max_grad_norm=args.max_grad_norm, batch_size=args.batch_size, grad_accum=args.grad_accum,
                          max_length=args.max_length, seed=args.seed, bf16=args.bf16,
                          gradient_checkpointing=args.gradient_checkpointing, resume=args.resume,
                          stop_after=args.stop_after,
                          save_every=args.save_every, log_every=args.log_every, device=args.device,
                          progress=not args.no_progress, fsdp=args.fsdp, param_dtype=args.param_dtype,
                          layers=args.layers, global_batch_size=args.global_batch_size)
        return Trainer(cfg)

    from probmoe.experiments import interrupts

    with interrupts.catch():
        try:
            return _train(args, common.run_or_exit(p, body))
        except interrupts.Interrupted as e:  # one line and 128 + the signal's number, no traceback
            return interrupts.report(e, args.output_dir)


def _train(args, trainer) -> int:
    from probmoe.experiments import distributed

    if trainer.nothing_to_do is not None:
        if trainer.world.main:
            print(trainer.nothing_to_do, file=sys.stderr)
        distributed.teardown()
        return 0
    if trainer.world.main:
        if trainer.no_answer:
            print(f"warning: --max-length {args.max_length} leaves no answer token in {trainer.no_answer} of "
                  f"{len(trainer.encoded)} examples; they add nothing to the loss (raise --max-length to keep them)",
                  file=sys.stderr)
        if trainer.resume_dir is not None:
            print(f"resumed from {trainer.resume_dir} at step {trainer.step} of {trainer.total_steps}", file=sys.stderr)
    last = trainer.run()
    if trainer.world.main and last:
        where = f"model in {args.output_dir}" if trainer.step == trainer.total_steps else \
            f"stopped at step {trainer.step} of {trainer.total_steps}: resume with --resume latest"
        print(f"step {last['step']}: loss {last['loss']:.4f}; {where}", file=sys.stderr)
    distributed.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
