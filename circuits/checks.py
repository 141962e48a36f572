"""Checks on logits, generators, integer arguments and cardinality ranges: the one home of each
check and its message, for the specs, ``Circuit``, ``CardinalityDP`` and every caller above them
(``probmoe``'s configs, distribution, ``route``, the routers and the patch). A public module of
``circuits``.

Every failure is a ``ValueError`` that names the argument and what is allowed. Type, rank and
device checks are free; a check on tensor values costs one host synchronisation, and under
torch.compile becomes an assertion in the graph with the same message (``require``).

torch is imported by the checks that take tensors, not by this module: the integer and cardinality
rules serve the specs and ``probmoe-compile``, which run without torch.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor

NAN = "logits contain NaN"
POSINF = "logits contain +inf; use finite logits, or -inf for 'never chosen'"


def integer(name: str, value, lo: int, hi: int | None = None, note: str = "", *, hi_name: str | None = None) -> int:
    """``value`` as an int in [lo, hi] (hi None: no upper bound), else ValueError naming ``name`` and
    the range: "k must be in [0, n = 64], got 65" (``hi_name`` names the bound; ``note`` follows it)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):  # the message only now: under torch.compile hi may be symbolic
        upper = f"{hi_name} = {hi}" if hi_name else (str(hi) if hi is not None else "inf")
        raise ValueError(f"{name} must be in [{lo}, {upper}]{note}, got {value}")
    return value


def cardinality(n: int, k=None, kmin=None, kmax=None, *, lowest: int = 0, note: str = "") -> tuple[int, int]:
    """Resolve ``k`` (exactly k) or ``kmin``/``kmax`` (a range) of ``n`` into (kmin, kmax) with
    lowest <= kmin <= kmax <= n, else ValueError naming the argument (``note`` follows each range). A
    missing ``kmin`` defaults to ``lowest``, a missing ``kmax`` to n."""
    if k is not None:
        if kmin is not None or kmax is not None:
            raise ValueError("pass either k (exactly k) or kmin/kmax (a range), not both")
        k = integer("k", k, lowest, n, note)
        return k, k
    if kmin is None and kmax is None:
        raise ValueError("pass k (exactly k) or kmin and kmax (a range of sizes)")
    kmin = integer("kmin", lowest if kmin is None else kmin, lowest, n, note)
    kmax = integer("kmax", n if kmax is None else kmax, lowest, n, note)
    if kmin > kmax:
        raise ValueError(f"kmin must be <= kmax, got kmin = {kmin}, kmax = {kmax}")
    return kmin, kmax


def generator(value, device: torch.device | None = None) -> None:
    """Raise unless ``value`` is None or a ``torch.Generator`` (on ``device``'s type, when given)."""
    if value is None:
        return
    import torch

    where = "" if device is None else f" on {torch.device(device).type}"
    if not isinstance(value, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator{where} or None, got {type(value).__name__}")
    if device is not None and value.device.type != torch.device(device).type:
        raise ValueError(f"generator must be a torch.Generator{where} or None, got one on {value.device}")


def logits(value, *, n: int | None = None, dim: int | None = None, device: torch.device | None = None) -> Tensor:
    """``value`` if it is a floating-point tensor [..., n] (exactly ``dim``-D, on ``device``, when
    given; any n >= 1 when ``n`` is None), else ValueError. No host synchronisation."""
    from torch import Tensor

    if not isinstance(value, Tensor):
        raise ValueError(f"logits must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {value.dtype}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"logits must be {dim}-D [tokens, experts], got shape {list(value.shape)}")
    if n is not None and (value.dim() == 0 or value.shape[-1] != n):
        raise ValueError(f"logits must have shape [..., n] with n = {n}, got {list(value.shape)}")
    if value.dim() == 0 or value.shape[-1] == 0:
        raise ValueError(f"logits must have shape [..., N] with N >= 1, got {list(value.shape)}")
    if device is not None and value.device != device:
        raise ValueError(f"logits is on {value.device} but the circuit is on {device}; use circuit.to(device)")
    return value


def require(ok: Tensor, message: str) -> None:
    """Raise ValueError(``message``) unless the 0-dim bool tensor ``ok`` is true (one host
    synchronisation). Under torch.compile, an asynchronous assertion kept in the graph instead: a
    RuntimeError with the same message (on CUDA a device-side assert)."""
    import torch

    if torch.compiler.is_compiling():
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise ValueError(message)


def no_nan_or_posinf(r: Tensor) -> None:
    """Raise for NaN or +inf in ``r`` (each a host synchronisation: for the path that already
    knows something is wrong, or under torch.compile)."""
    require(~r.isnan().any(), NAN)
    require(~r.isposinf().any(), POSINF)
