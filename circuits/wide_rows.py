"""fp32 marginals of wide rows from the float64 passes (``circuits.ops`` calls ``refine``).

In a cardinality constraint (``ExactlyK``, ``RangeK``) the likely subsets of a row differ by single
logits (one swapped, one in or out), and after the exactly-k shift and the passes' tilt float32
holds those differences to its last bits. In other circuits (the group constraints, CNF, any SDD)
two likely assignments can differ by whole sums of logits, and a float32 pass rounds them at the
scale of the sums: GroupLimited(64, 8 of 8 groups of 8, at most 2 groups) at logits N(0, 100^2)
has marginals off by up to 9.5e-6, at N(0, 10^2) by 1.8e-6, against a float64 reference on the
same float32 logits. The rows whose finite logits spread over more than ``WIDE`` are evaluated
again in float64 (the torch passes), where the error scales down by 2^-29; narrower rows keep the
float32 pass (the error grows with the spread: below 1e-6 there).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .spec import ExactlyK, RangeK

#: A float32 row whose finite logits spread over more than this takes the float64 passes.
WIDE = 32.0


def needed(spec) -> bool:
    """Whether a circuit compiled from ``spec`` (None: a layout of unknown origin) refines wide rows."""
    return not isinstance(spec, (ExactlyK, RangeK))


def refine(circuit, r: Tensor, shift: Tensor | None, m: Tensor) -> Tensor:
    """m [T, n] (float32 marginals of r [T, n] less shift [T, 1] or None) with its wide rows
    recomputed in float64, in place; unchanged for other dtypes and circuits that need none."""
    if r.dtype != torch.float32 or not circuit.refines_wide_rows or r.shape[0] == 0:
        return m
    lo, hi = torch.aminmax(r)  # one pass: a batch within WIDE overall has no wide row (one host sync)
    if not bool(hi - lo > WIDE):  # (NaN: the rows are refused after the pass, Circuit._check)
        return m
    finite = torch.isfinite(r)
    spread = torch.where(finite, r, -torch.inf).amax(-1) - torch.where(finite, r, torch.inf).amin(-1)  # [T]
    rows = (spread > WIDE).nonzero().squeeze(1)  # a second host sync
    if rows.numel():
        x = r[rows].double()
        if shift is not None:
            x = x - shift[rows].double()
        m[rows] = circuit.passes(torch.float64).log_partition(x, True)[1].to(m.dtype)
    return m
