"""What the scale-out integrations (torchtitan, Megatron-Core) share and import no framework for: the
per-rank sampling seed, and the weights of a routing drawn from biased logits carried over to the
unbiased scores (the aux-free expert bias).

Draws under data parallelism: a router with seed s draws on global rank r from a generator seeded
s · 1,000,003 + r, so a run repeats its draws and two data-parallel ranks (which see different
tokens; expert-parallel ranks are data-parallel ranks too) draw independently.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from probmoe.methods.balance import unbiased_weights  # noqa: F401 (the name its importers use)

RANK_STRIDE = 1_000_003


def rank_seed(seed: int, rank: int | None = None) -> int:
    """The seed of ``rank`` (default: this process's global rank, 0 without torch.distributed)."""
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return (seed * RANK_STRIDE + rank) % 2**63


def rank_generator(seed: int, device: torch.device | str = "cpu", rank: int | None = None) -> torch.Generator:
    """A generator on ``device`` seeded ``rank_seed(seed, rank)``."""
    return torch.Generator(device=device).manual_seed(rank_seed(seed, rank))
