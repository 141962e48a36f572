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
    trainer      the training loop behind ``probmoe-train``
    generation   greedy GSM8K generation and scoring behind ``probmoe-eval``
    capture      per-layer routing of a data set behind ``probmoe-analyze``

The command-line front ends are in ``probmoe.cli``. ``import probmoe`` imports none of this.
"""
