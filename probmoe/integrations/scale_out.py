"""What the scale-out integrations (torchtitan, Megatron-Core) share and import no framework for: the
per-rank sampling seed, and the weights of a routing drawn from biased logits carried over to the
unbiased scores (the aux-free expert bias).

Draws under data parallelism: a router with seed s draws on global rank r from a generator seeded
s · 1,000,003 + r, so a run repeats its draws and two data-parallel ranks (which see different
tokens; expert-parallel ranks are data-parallel ranks too) draw independently. Under torch.compile
(no generator can enter a graph) each draw's seed is the default generator's, mixed with that rank
key (``compiled_seed``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from probmoe.methods.balance import unbiased_weights  # noqa: F401 (the name its importers use)

RANK_STRIDE = 1_000_003
SEED_BOUND = 1 << 62  # seeds lie in [0, SEED_BOUND), as circuits.kernels.uniforms draws them


def rank_seed(seed: int, rank: int | None = None) -> int:
    """The seed of ``rank`` (default: this process's global rank, 0 without torch.distributed)."""
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return (seed * RANK_STRIDE + rank) % 2**63


def rank_generator(seed: int, device: torch.device | str = "cpu", rank: int | None = None) -> torch.Generator:
    """A generator on ``device`` seeded ``rank_seed(seed, rank)``."""
    return torch.Generator(device=device).manual_seed(rank_seed(seed, rank))


def compiled_seed(logits: Tensor, seed: int, rank: int | None = None) -> Tensor:
    """The seed of one draw under torch.compile, where no ``torch.Generator`` can enter the graph: a
    seed drawn from torch's default generator of the logits' device (``circuits.ops.draw_seed``, an
    operator the compiled graph keeps; activation checkpointing restores that generator, so a
    recomputation draws the same) mixed with this rank's key ``rank_seed(seed, rank)`` by XOR, so
    that data-parallel ranks whose default generators run in step (torchtitan seeds them alike) draw
    apart. 0-dim int64 in [0, 2^62), on the logits' device; no host synchronisation."""
    from circuits.ops import draw_seed  # the operator behind the default generator's seeds

    key = rank_seed(seed, rank) % SEED_BOUND
    return torch.bitwise_xor(draw_seed(logits.detach()), key)
