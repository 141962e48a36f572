"""Train a patched tiny model with transformers.Trainer: the recipe of docs/transformers.md, runnable
as it is on the CPU (no download) and under ``accelerate launch`` (DDP or FSDP, from its config).

    python tools/hf_trainer_example.py --output /tmp/run
    accelerate launch --config_file fsdp.yaml tools/hf_trainer_example.py --output /tmp/run

Prints one JSON line per log of the main process, then the path of the saved model; the saved
model reloads with ``probmoe.integrations.transformers.from_pretrained`` and its routing.
"""

from __future__ import annotations

import argparse
import json

import torch


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="output directory (checkpoints, final model)")
    parser.add_argument("--family", default="olmoe", help="model type of the tiny model (default: olmoe)")
    parser.add_argument("--method", default="probmoe", help="patch_model method (default: probmoe)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (default: 4)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="turn on gradient checkpointing")
    args = parser.parse_args(argv)

    import datasets
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import probmoe.integrations.transformers as pt
    from probmoe.integrations.transformers.callback import RoutingStatsCallback
    from probmoe.integrations.transformers.testing import tiny_model

    model = pt.patch_model(tiny_model(args.family), args.method, aux_loss=0.01)
    model.config.output_router_logits = True  # the aux loss enters the Trainer's loss
    ids = torch.randint(3, 40, (32, 16), generator=torch.Generator().manual_seed(0)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    training = TrainingArguments(
        output_dir=args.output,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=not torch.cuda.is_available(),
        seed=0,
    )

    class PrintLogs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero:
                print(json.dumps({"step": state.global_step, **logs}), flush=True)

    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[PrintLogs()])
    RoutingStatsCallback().attach(trainer)
    trainer.train()
    final = f"{args.output}/final"
    trainer.save_model(final)
    if trainer.is_world_process_zero():
        print(f"saved {final}", flush=True)


if __name__ == "__main__":
    main()
