"""Checks on logits, generators, integer arguments and cardinality ranges: the one home of each
check and its message, for the specs, ``Circuit``, the DPs and every caller above them
(``probmoe``'s configs, distribution, ``route``, the routers and the patch). A public module of
``circuits``.

Every failure is a ``ValueError`` that names the argument and what is allowed (on CUDA, the value
checks' failures are device-side asserts with the same messages: below). Type, rank and
device checks are free. A check on tensor values reads them on the host for tensors on the CPU
(one host synchronisation, a ValueError at once); it is an asynchronous assertion in the graph
(``require``, ``torch._assert_async``), with no host synchronisation, where ``in_graph`` says so:

- under torch.compile (a RuntimeError with the same message when the graph runs);
- for tensors on CUDA, where reading a value on the host would stall the host until the GPU has
  caught up, once per call, in every training step. The check is then a few small kernels and a
  failure is a device-side assert, as torch's own CUDA kernels report an index out of range: the
  kernel prints the message on stderr ("Assertion `logits contain NaN` failed"), and a later
  CUDA call, often one inside the same routing call and at the latest the next synchronisation,
  raises "CUDA error: device-side assert triggered" (a RuntimeError; ``torch.AcceleratorError``
  in recent torch) with a traceback that may point elsewhere. The CUDA context is then unusable
  and the process must start again. For the one-line ValueError naming the argument and the row,
  run the same call on the CPU (``logits.cpu()``). We chose this over skipping the checks on
  CUDA: a NaN or an infeasible row would otherwise route silently on garbage, and a late, loud
  failure beats a silent one. ``validate = False`` (``validate_args=False`` in probmoe) leaves
  the checks out on every device;
- for "meta" tensors, which have no values to read (a model traced for its shapes).

Other devices (MPS, XPU) read the values on the host like the CPU.

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
# the largest finite |logit| (exclusive): the fp32 passes' sums of up to 2**31 logits stay finite
# (3e38 logits overflowed them, and a circuit called its rows unsatisfiable), and the DP's tilted
# sums stay far above its log-zero, -1e30
MAX_ABS_LOGIT = 1e20
HUGE = f"logits must be -inf or finite with |logits| < {MAX_ABS_LOGIT:g}"
IN_GRAPH_DEVICES = ("cuda", "meta")  # value checks as assertions in the graph (the module's docstring)
ASSERT_CHARS = 254  # the most of a message that CUDA's device-side assert takes (more: an error at launch)


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
    """Raise unless ``value`` is None, a ``torch.Generator`` or a seed tensor (0-dim int64: the draw
    is a function of its value alone, as under torch.compile, where a Generator cannot enter the
    graph), on ``device``'s type when given. No host synchronisation."""
    if value is None:
        return
    import torch

    where = "" if device is None else f" on {torch.device(device).type}"
    allowed = f"a torch.Generator{where}, a 0-dim int64 seed tensor{where}, or None"
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype != torch.int64:
            raise ValueError(f"generator must be {allowed}, got a {value.dtype} tensor of shape {list(value.shape)}")
    elif not isinstance(value, torch.Generator):
        raise ValueError(f"generator must be {allowed}, got {type(value).__name__}")
    if device is not None and value.device.type != torch.device(device).type:
        raise ValueError(f"generator must be {allowed}, got one on {value.device}")


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


def in_graph(t: Tensor) -> bool:
    """Whether the value checks on ``t`` are assertions in the graph, with no host synchronisation
    (under torch.compile, and for tensors on CUDA or "meta": the module's docstring), rather than a
    read on the host and a ValueError at once (the CPU, and every other device)."""
    import torch

    return torch.compiler.is_compiling() or t.device.type in IN_GRAPH_DEVICES


def require(ok: Tensor, message: str) -> None:
    """Raise ValueError(``message``) unless the 0-dim bool tensor ``ok`` is true (one host
    synchronisation). Where ``in_graph``, an asynchronous assertion instead, ``torch._assert_async``:
    under torch.compile a RuntimeError with the same message when the graph runs, on CUDA a
    device-side assert (the module's docstring)."""
    import torch

    if in_graph(ok):
        torch._assert_async(ok, message[:ASSERT_CHARS])
    elif not bool(ok):
        raise ValueError(message)


def allowed(r: Tensor) -> Tensor:
    """Which logits the evaluators take: -inf, or finite with |r| < ``MAX_ABS_LOGIT`` (NaN and +inf
    are not): r's shape, bool."""
    import torch

    return (r.abs() < MAX_ABS_LOGIT) | (r == -torch.inf)


def logit_values(r: Tensor) -> None:
    """Raise ValueError for NaN, +inf or a finite |logit| >= ``MAX_ABS_LOGIT`` in ``r``: on the CPU
    one host synchronisation, the values looked at again only to name what failed ("logits must be
    -inf or finite with |logits| < 1e+20, got 3e+38"); three assertions where ``in_graph``."""
    import torch

    if in_graph(r):
        require(~r.isnan().any(), NAN)
        require(~r.isposinf().any(), POSINF)
        require(allowed(r).all(), HUGE)
    elif not bool(allowed(r).all()):
        if r.isnan().any():
            raise ValueError(NAN)
        if r.isposinf().any():
            raise ValueError(POSINF)
        worst = torch.where(r > -torch.inf, r.abs(), 0).argmax()
        raise ValueError(f"{HUGE}, got {r.flatten()[worst].item():g}")
