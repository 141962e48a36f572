"""Checks on logits and generators: the one home of each check and its message, for ``Circuit``
and every caller above it (``probmoe``'s distribution, ``route``, the routers and the patch).

Every failure is a ``ValueError`` that names the argument and what is allowed. Type, rank and
device checks are free; a check on tensor values costs one host synchronisation, and under
torch.compile becomes an assertion in the graph with the same message (``require``).
"""

from __future__ import annotations

import torch
from torch import Tensor

NAN = "logits contain NaN"
POSINF = "logits contain +inf; use finite logits, or -inf for 'never chosen'"


def generator(value, device: torch.device | None = None) -> None:
    """Raise unless ``value`` is None or a ``torch.Generator`` (on ``device``'s type, when given)."""
    if value is None:
        return
    where = "" if device is None else f" on {torch.device(device).type}"
    if not isinstance(value, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator{where} or None, got {type(value).__name__}")
    if device is not None and value.device.type != torch.device(device).type:
        raise ValueError(f"generator must be a torch.Generator{where} or None, got one on {value.device}")


def logits(value, *, n: int | None = None, dim: int | None = None, device: torch.device | None = None) -> Tensor:
    """``value`` if it is a floating-point tensor [..., n] (exactly ``dim``-D, on ``device``, when
    given; any n >= 1 when ``n`` is None), else ValueError. No host synchronisation."""
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
    if torch.compiler.is_compiling():
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise ValueError(message)


def no_nan_or_posinf(r: Tensor) -> None:
    """Raise for NaN or +inf in ``r`` (each a host synchronisation: for the path that already
    knows something is wrong, or under torch.compile)."""
    require(~r.isnan().any(), NAN)
    require(~r.isposinf().any(), POSINF)
