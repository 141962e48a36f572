"""The random numbers of exact sampling: counter-based uniforms from one seed.

Each uniform is a pure function of a seed and its index (the splitmix64 finaliser of
seed + (index + 1) * golden, top 24 bits, in [0, 1) like ``torch.rand``'s float32), so they are
made in any order by any thread, by C (``c/uniforms.c``, on the CPU when the library is built,
as ``circuits.kernels.select`` gives it) or by ``reference``, the plain-torch meaning and the C code's
oracle (and the CUDA path): the same bits either way, on every device. A call takes one seed, a 0-dim int64 tensor drawn from
the caller's generator by ``seed_tensor``: drawing it is a tensor operation, so neither drawing
nor using it reads a value on the host outside an operator (torch.compile traces through it).
"""

from __future__ import annotations

import torch
from torch import Tensor

_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
SEED_BOUND = 1 << 62


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def reference(seed: int | Tensor, offset: int, count: int, device=None) -> Tensor:
    """u(seed, i) for i = offset .. offset + count - 1: float32 [count] (int64 arithmetic wraps as
    the C code's uint64 does). ``seed``: an int, or a 0-dim int64 tensor (its device is used)."""
    if isinstance(seed, Tensor):
        device = seed.device
    z = torch.arange(offset + 1, offset + 1 + count, dtype=torch.int64, device=device) * _signed(_GOLDEN) + seed
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    z = z ^ _shr(z, 31)
    return _shr(z, 40).to(torch.float32) * 2.0**-24


def seed_tensor(generator: torch.Generator | None, device: torch.device | str = "cpu") -> Tensor:
    """One seed in [0, 2**62) from ``generator`` (None: torch's default generator of ``device``):
    a 0-dim int64 tensor on the generator's device."""
    where = generator.device if generator is not None else torch.device(device)
    return torch.randint(SEED_BOUND, (), generator=generator, dtype=torch.int64, device=where)


def as_seed(seed: Tensor | torch.Generator | None, device) -> Tensor:
    """``seed`` if it is a seed tensor, else ``seed_tensor`` drawn from it (a generator; None: the
    default generator of ``device``)."""
    return seed if isinstance(seed, Tensor) else seed_tensor(seed, device)


def seed_from(generator: torch.Generator | None) -> int:
    """``seed_tensor`` on the CPU as a Python int (reads its value: eager code only)."""
    return int(seed_tensor(generator))


def uniforms(seed: Tensor, count: int, device: torch.device, dtype: torch.dtype, lib=None) -> Tensor:
    """``count`` uniforms in [0, 1) of ``dtype`` on ``device`` from a 0-dim int64 ``seed``: [count];
    made in float32 (then cast) by the C kernels library ``lib`` on the CPU, by ``reference``
    without one (``select`` gives it: ``RowOps.uniforms``).

    On the CPU the seed's value is read (inside an operator: see ``circuits.ops``); on CUDA the
    uniforms are computed on the device from the seed tensor, with no host synchronisation."""
    device = torch.device(device)
    if device.type != "cpu":
        return reference(seed.to(device), 0, count).to(dtype)
    value = int(seed)
    if lib is None:
        return reference(value, 0, count).to(dtype)
    out = torch.empty(count, dtype=torch.float32)
    lib.pm_uniforms(value, 0, count, out.data_ptr(), torch.get_num_threads())
    return out.to(dtype)
