"""``ProbMoETrainer``: torchtitan's own ``Trainer`` (0.3.0) for models routed by ``ProbMoERouter``.

Two things over torchtitan's: every MoE counts used slots only in ``tokens_per_expert_E`` (what the
aux-free bias update reads; ``count_used_slots``), and, where no accelerator is present, torchtitan
builds its meshes, process group (gloo) and token exchanges on the CPU (``use_cpu_device``) instead
of assuming "cuda", its FSDP2 reducing by sums (gloo has no PREMUL_SUM; ``cpu``). And, on any
device, ``torch.distributed.set_timeout`` where torch lacks it: torchtitan 0.3.0 calls it after the
first step (``torchtitan/distributed/utils.py:595``, ``set_pg_timeouts``); torch 2.13 has the same
function as ``distributed_c10d._set_pg_timeout`` only. Everything else (job config and CLI, FSDP2, EP, activation checkpointing, the
optimizer and its load-balancing hook, checkpoints, metrics) is torchtitan's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch._utils import _get_available_device_type
from torch.distributed import distributed_c10d
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
        for part in self.model_parts:
            count_used_slots(part)
            if on_cpu:
                sum_reductions(part)
