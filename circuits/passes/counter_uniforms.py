"""``uniforms``: the random numbers of exact sampling, as counter-based draws on the CPU.

Each uniform is a pure function of a seed and its index (the splitmix64 finaliser of
seed + (index + 1) * golden, top 24 bits, in [0, 1) like ``torch.rand``'s float32), so they are
made in any order by any thread, by C (``c/uniforms.c``, when the library is there) or by
``reference``, the plain-torch meaning and the C code's oracle: the same bits either way, so a
seeded generator gives the same draws with and without the C library. One seed is taken from the
caller's generator per call. CUDA tensors take ``torch.rand`` (one kernel, no host
synchronisation to read a seed).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import c_library

_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def reference(seed: int, offset: int, count: int) -> Tensor:
    """u(seed, i) for i = offset .. offset + count - 1: float32 [count] (int64 arithmetic wraps as
    the C code's uint64 does)."""
    z = torch.arange(offset + 1, offset + 1 + count, dtype=torch.int64) * _signed(_GOLDEN) + _signed(seed)
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    z = z ^ _shr(z, 31)
    return _shr(z, 40).to(torch.float32) * 2.0**-24


def seed_from(generator: torch.Generator | None) -> int:
    """One 62-bit seed from ``generator`` (None: torch's default CPU generator)."""
    return int(torch.randint(1 << 62, (), generator=generator, dtype=torch.int64))


def uniforms(count: int, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``count`` uniforms in [0, 1) of ``dtype`` on ``device``: [count], counter-based on the CPU
    (one seed from ``generator``), ``torch.rand`` on CUDA."""
    if device.type != "cpu":
        return torch.rand(count, generator=generator, device=device, dtype=dtype)
    seed, lib = seed_from(generator), c_library.library()
    if lib is None:
        return reference(seed, 0, count).to(dtype)
    out = torch.empty(count, dtype=torch.float32)
    lib.pm_uniforms(seed, 0, count, out.data_ptr(), torch.get_num_threads())
    return out.to(dtype)
