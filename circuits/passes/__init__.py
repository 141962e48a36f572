"""The circuit passes: one computation, several implementations, one place that picks.

    program.py       Program: a level layout as device tensors; draw_uniforms (shared by all)
    interface.py     Passes: log Z + marginals, sample, MAP, Cov(z) v, the k-th largest logit
    torch_passes.py  TorchPasses: plain tensor operations, any device and dtype (the meaning;
                     the oracle of the others)
    c_passes.py      CPasses: fused C for fp32 on the CPU (sources in c/, built by c_library.py)
    by_node.py       the definition, node by node in Python: the oracle of TorchPasses (tests)
    scratch.py       ScratchPool: reused [rows, T] buffers

``select(program, dtype)`` is the only place that decides which implementation runs.
"""

from __future__ import annotations

import torch

from . import c_library
from .c_passes import CPasses
from .interface import Passes
from .program import Program, draw_uniforms
from .torch_passes import TorchPasses

__all__ = ["CPasses", "Passes", "Program", "TorchPasses", "describe", "draw_uniforms", "select"]


def select(program: Program, dtype: torch.dtype) -> Passes:
    """The passes for ``program`` (on its device) with logits of ``dtype``: the fused C passes for
    float32 on the CPU when their library is available, else the torch passes."""
    if program.device.type == "cpu" and dtype == torch.float32 and c_library.library() is not None:
        return CPasses(program)
    return TorchPasses(program)


def describe() -> str:
    """Which passes float32 CPU calls take, and why: one line for reports (fp64 and CUDA calls
    take the torch passes)."""
    if c_library.library() is not None:
        return f"fused C passes ({c_library.describe()})"
    return f"torch passes ({c_library.describe()})"
