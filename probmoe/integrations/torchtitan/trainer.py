"""``ProbMoETrainer``: torchtitan's own ``Trainer`` (0.3.0) for models routed by ``ProbMoERouter``.

What it adds to torchtitan's:
- every MoE counts used slots only in ``tokens_per_expert_E``, what the aux-free bias update reads
  (``count_used_slots``; a Dynamic-k token's unused slots are not counted);
- where no accelerator is present, the CPU with gloo (``cpu.use_cpu_trainer``: torchtitan assumes
  "cuda" then) and FSDP2 reducing by sums (``cpu.sum_reductions``: gloo has no PREMUL_SUM);
- on any device, ``torch.distributed.set_timeout`` where torch lacks it: torchtitan 0.3.0 calls it
  after the first step (``torchtitan/distributed/utils.py:595``, ``set_pg_timeouts``), torch 2.13
  has it as ``distributed_c10d._set_pg_timeout`` only.
Everything else (job config and CLI, FSDP2, EP, activation checkpointing, the optimizer and its
load-balancing hook, checkpoints, metrics) is torchtitan's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch._utils import _get_available_device_type
from torch.distributed import distributed_c10d
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from .cpu import sum_reductions, use_cpu_trainer
from .stats import count_used_slots


class ProbMoETrainer(Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        pass

    def __init__(self, config: Config):
        if not hasattr(dist, "set_timeout"):
            dist.set_timeout = distributed_c10d._set_pg_timeout
        on_cpu = _get_available_device_type() is None
        if on_cpu:
            use_cpu_trainer()
        super().__init__(config)
        counted = 0
        for part in self.model_parts:
            counted += len(count_used_slots(part))
            if on_cpu:
                sum_reductions(part)
        logger.info(f"ProbMoE: {counted} MoE layers count used slots only in tokens_per_expert_E")
