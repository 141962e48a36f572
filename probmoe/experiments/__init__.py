"""The experiment commands' machinery (transformers 5.x, the ``transformers`` extra).

    formats      SFT data files (question/answer, prompt/completion, messages, text; JSON lines,
                 JSON, Parquet through datasets), every record checked
    data         examples as tokens with the loss mask (the answer tokens; chat templates)
    tokenizer    the byte-level tokenizer of the built-in tiny models (built offline), chat template
    models       built-in tiny models, published shapes and local checkpoints, checked before any weights load
    shapes       the published configurations (OLMoE-1B-7B, Qwen1.5-MoE-A2.7B, ...) for ``--model *-shape``
    distributed  torch.distributed set-up (torchrun: gloo on CPU, NCCL on GPU), rank helpers
    fsdp         ``--fsdp``: FSDP2 sharding from the meta device, sharded checkpoints, the final gather
    memory_plan  ``--plan``: per-GPU memory under DDP and FSDP, and the refusal of runs that cannot fit
    state        the exact-resume training state (optimizer, scheduler, step, every RNG), checked;
                 the newest undamaged checkpoint for ``--resume latest``
    interrupts   SIGINT/SIGTERM: stop at a step boundary, one line, status 130/143
    run_lock     one run per output folder: the lock a run holds on it from its checks to its end
    trainer      the training loop behind ``probmoe-train``
    tracking     ``--report-to``: the training curves in TensorBoard or Weights & Biases
    capture      per-layer routing of a data set, and the checkpoints-by-data-sets loop, behind ``probmoe-analyze``
    run_config   every option of the three commands, with its default, help and check (one dataclass each)
    config_parser  the commands' flags generated from ``run_config``, ``--config`` YAML/TOML files, config.yaml
    options      argument checks, the device, output folders, clean exits: shared with the tools

The command-line front ends are in ``probmoe.cli``; GSM8K generation and the LM Evaluation
Harness model are ``probmoe.eval`` (which imports this package; this package never imports it).
``import probmoe`` imports none of this.
"""
