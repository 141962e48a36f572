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
    """A group spec's lattice (``spec``: a ``circuits.GroupLimited`` or ``GroupCapacity``, read for its
    n, kmin, kmax, groups, max_groups and capacity), for logits on ``device``."""

    spec: object
    device: torch.device
