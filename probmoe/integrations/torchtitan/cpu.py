"""torchtitan's trainer (0.3.0) on the CPU: ``use_cpu_trainer`` sets what it assumes to be CUDA where
no accelerator is present. ``torchtitan/tools/utils.py`` (``get_device_info``) takes "cuda" then,
and two modules read that at import: the meshes, process group and token exchanges (``use_cpu_device``
resets those), and ``torchtitan/components/metrics.py`` (``DeviceMemoryMonitor.__init__`` calls
``torch.cuda.get_device_name``; ``torch.cpu`` has no memory statistics), whose monitor this replaces
with ``CPUMemoryMonitor``; and ``torchtitan/distributed/utils.py:586`` (``set_pg_timeouts``, after
the first step: ``barrier(device_ids=[device_module.current_device()])``, where ``torch.cpu`` answers
"cpu", not an index), whose device module becomes ``CPUDeviceModule``. Process-wide; for CPU runs and tests only. And ``sum_reductions``: gloo
has no ``ReduceOp.PREMUL_SUM``, which FSDP2 reduce-scatters with once torchtitan sets its gradient
divide factor to 1 (``torchtitan/distributed/fsdp.py``, ``disable_fsdp_gradient_division``)."""

from __future__ import annotations

import os
import resource

import torch
from torch.distributed.fsdp import FSDPModule
from torchtitan.components import metrics

from .parallel import use_cpu_device

_GIB = 1024**3


class CPUMemoryMonitor:
    """torchtitan's ``DeviceMemoryMonitor`` for the CPU: the process's peak resident set (since it
    started: the OS keeps no resettable peak) against the machine's memory."""

    device_name = "cpu"

    def __init__(self):
        self.device_capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.device_capacity_gib = self.device_capacity / _GIB

    def get_peak_stats(self) -> metrics.DeviceMemStats:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        gib, pct = peak / _GIB, 100 * peak / self.device_capacity
        return metrics.DeviceMemStats(gib, pct, gib, pct, 0, 0)

    def reset_peak_stats(self) -> None:
        pass


class CPUDeviceModule:
    """``torch.cpu`` with the device index torchtitan's barrier passes (gloo ignores it)."""

    @staticmethod
    def current_device() -> int:
        return 0

    synchronize = staticmethod(torch.cpu.synchronize)


def use_cpu_trainer() -> None:
    """Make torchtitan's ``Trainer`` build on the CPU with gloo (see the module docstring)."""
    import torchtitan.distributed.utils as dist_utils

    use_cpu_device()
    dist_utils.device_module = CPUDeviceModule
    metrics.device_type = "cpu"
    metrics.build_device_memory_monitor = CPUMemoryMonitor


def sum_reductions(model: torch.nn.Module) -> None:
    """Make every FSDP2 unit of ``model`` reduce gradients by plain sums, scaling apart (FSDP's
    ``set_force_sum_reduction_for_comms``): with a divide factor of 1, PREMUL_SUM(1) is a sum, so
    the gradients are the same, and gloo can run it."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
