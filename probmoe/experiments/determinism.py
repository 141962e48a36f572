"""``probmoe-train --deterministic``: the same seeded run twice gives the same weights, bit for bit.

The one kernel found to differ between runs on a multi-core CPU is the gradient of the experts'
token gather in transformers' MoE experts (``hidden_states[token_idx]``, each token listed once per
chosen expert): its backward is ``index_put_(..., accumulate=True)``, which on the CPU adds the
rows in the order the threads reach them. With top-2 every token's gradient is the sum of two rows,
``a + b == b + a`` exactly, so OLMoE's tiny top-2 runs repeat; from top-3 on (the tiny DeepSeek-V3,
OLMoE-1B-7B's top-8) the sums round differently from run to run (73 of 85 tensors differed by up
to 1e-6 after a few steps on 2 threads; one thread, or ``torch.use_deterministic_algorithms``,
repeats). The deterministic CPU kernel sorts the indices first and was not slower where measured
(T = 4,096 tokens, top-8, 2,048 wide: 0.27 s against 1.09 s on a 2-core EPYC; 512 x 3 x 64: 0.1
against 7 ms), so ``auto`` turns it on for the CPU. On CUDA it is off under ``auto`` (deterministic
CUDA kernels cost time and need ``CUBLAS_WORKSPACE_CONFIG``, which ``on`` sets when unset).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

CHOICES = ("auto", "on", "off")


def wanted(choice: str, device: torch.device) -> bool:
    """Whether ``--deterministic choice`` turns deterministic kernels on for a run on ``device``."""
    if choice not in CHOICES:
        raise ValueError(f"--deterministic must be one of {', '.join(CHOICES)}, got {choice!r}")
    return choice == "on" or (choice == "auto" and device.type == "cpu")


@contextmanager
def kernels(choice: str, device: torch.device):
    """``torch.use_deterministic_algorithms`` as ``choice`` asks while the block runs (warn-only: an
    op without a deterministic kernel warns instead of failing), the process's setting restored after."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if wanted(choice, device):
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    elif choice == "off":
        torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
