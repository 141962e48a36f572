"""``Lattice`` and ``GroupLattice``: what the dynamic programs sweep over, the things
``circuits.kernels.select`` picks their sweeps from, as it picks the circuit passes from a ``Program``:
the cardinality DP's (``TorchDP``, ``CDP``, ``TritonDP``) and the group DP's (``TorchGroupDP``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Lattice:
    """kmin..kmax true of n variables, for logits on ``device``."""

    n: int
    kmin: int
    kmax: int
    device: torch.device


@dataclass(frozen=True)
class GroupLattice:
    """kmin..kmax true of n variables in contiguous groups of sizes ``groups``, at most ``capacity``
    true in a group and at most ``max_groups`` nonempty groups (a ``circuits.GroupLimited`` or
    ``GroupCapacity`` spec's fields), for logits on ``device``."""

    n: int
    kmin: int
    kmax: int
    groups: tuple[int, ...]
    max_groups: int
    capacity: int
    device: torch.device
