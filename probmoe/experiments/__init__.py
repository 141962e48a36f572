"""The experiment commands' machinery (transformers 5.x, the ``transformers`` extra).

    data         question/answer JSON-lines files, checked; prompt + answer tokens, loss mask
    tokenizer    the byte-level tokenizer of the built-in tiny models (built offline)
    models       built-in tiny models and local checkpoints, checked before any weights load
    distributed  torch.distributed set-up (torchrun: gloo on CPU, NCCL on GPU), rank helpers
    state        the exact-resume training state (optimizer, scheduler, step, every RNG), checked
    trainer      the training loop behind ``probmoe-train``
    generation   greedy GSM8K generation and scoring behind ``probmoe-eval``
    capture      per-layer routing of a data set behind ``probmoe-analyze``

The command-line front ends are in ``probmoe.cli``. ``import probmoe`` imports none of this.
"""
