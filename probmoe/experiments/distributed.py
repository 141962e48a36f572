"""torch.distributed for the experiment commands: the same command alone or under ``torchrun``.

Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) ``setup`` joins the process group
(gloo on the CPU, NCCL when CUDA is present) and picks this rank's device; alone it does
nothing. Multi-node runs are ``torchrun``'s business (``--nnodes``, ``--rdzv-endpoint``): see
docs/experiments.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        """Rank 0: the only one that writes files and logs."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def setup(device: str | None = None) -> World:
    """This process's place in the job. ``device``: "cpu", "cuda" or None (CUDA when present)."""
    size, rank, local_rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"--device must be 'cpu' or 'cuda', got {device!r}")
    use_cuda = torch.cuda.is_available() if device is None else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if use_cuda and local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"LOCAL_RANK {local_rank} has no GPU: this node shows {torch.cuda.device_count()}; start "
            "at most that many processes per node"
        )
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if size > 1 and not dist.is_initialized():
        # NCCL for CUDA tensors, gloo for the few CPU ones (the agreement on checks below)
        dist.init_process_group("cpu:gloo,cuda:nccl" if use_cuda else "gloo")
    return World(rank, size, local_rank, dev)


def agree(error: Exception | None) -> None:
    """Every process learns whether any process failed its checks: the failing ones raise their own
    error, the others a ValueError saying so (instead of waiting in the next collective)."""
    failed = torch.tensor([0 if error is None else 1])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(failed)
    if error is not None:
        raise error
    if failed.item():
        raise ValueError(f"{failed.item()} other process(es) failed their checks (see their error); stopping")


def teardown(barrier: bool = True) -> None:
    """Leave the process group, after the others reach this point too (``barrier``; not when they
    may be stuck elsewhere, as after a forced interrupt)."""
    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def all_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum of ``value`` over the ranks (itself when alone); a new tensor."""
    value = value.clone()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(value)
    return value


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def any_signal(signum: int | None) -> int | None:
    """The highest signal number any rank received (``interrupts.requested()``), or None: every
    rank stops at the same step when one of them is told to."""
    value = torch.tensor([signum or 0])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item()) or None
