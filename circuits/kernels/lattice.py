"""``Lattice``: what the cardinality DP sweeps over, the thing ``circuits.kernels.select`` picks the
DP's sweeps (``TorchDP``, ``CDP``, ``TritonDP``) from, as it picks the circuit passes from a ``Program``."""

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
