"""``gate_weights``: the routing weights of Eq. 7 at the used slots, as one autograd step: the last
step of ``route``'s composed path (where a training route is not one ``circuits::chosen_scores``
call: float64, CUDA, no C kernels, structured constraints, the ablations, eval).

    w = where(mask, π.gather(idx) · (1 + t.gather(idx)), 0)        π = softmax(r) or sigmoid(r)

where t is the zero-valued tangent carrying the straight-through gradient (``SubsetDistribution.
mean_tangent``). Written out with torch operations (``reference``, the oracle of the tests) the
graph keeps π [T, N], the gather indices twice and the products' operands: 2.5 MiB at T = 4096,
N = 64, k = 8, on top of the logits the marginals keep. ``GateWeights`` keeps only the logits
(the same storage the marginals keep), the indices as int32 and the mask, and recomputes π in the
backward: 1.3 MiB in all for that call. Both use Eq. 7's one torch home,
``circuits.kernels.straight_through`` (the weights, ``slot_tangents`` and ``scores_backward``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from circuits.kernels import straight_through

from .scores import gate_scores


def reference(r: Tensor, t: Tensor | None, idx: Tensor, mask: Tensor, kind: str) -> Tensor:
    """The plain torch meaning: r, t [T, N]; idx [T, kmax] long; mask [T, kmax] bool -> w [T, kmax]
    (``circuits.kernels.straight_through.weights``)."""
    return straight_through.weights(gate_scores(r, kind), idx, mask, t)


class GateWeights(torch.autograd.Function):
    """``reference`` with a smaller graph (same value; gradients equal up to rounding)."""

    @staticmethod
    def forward(ctx, r: Tensor, t: Tensor, idx: Tensor, mask: Tensor, kind: str, p: Tensor | None = None) -> Tensor:
        p = gate_scores(r, kind) if p is None else p  # [T, N]
        w = straight_through.weights(p, idx, mask)  # [T, kmax]; t's value is 0
        ctx.kind = kind
        ctx.save_for_backward(r, idx.to(torch.int32), mask)
        return w

    @staticmethod
    def backward(ctx, gw: Tensor):
        r, idx32, mask = ctx.saved_tensors
        p = gate_scores(r, ctx.kind)  # [T, N], recomputed
        g_t = straight_through.slot_tangents(idx32, mask, gw, p)  # dL/dt [T, N]; unused slots carry none
        g_r = straight_through.scores_backward(g_t, p, ctx.kind)  # the scores' backward: dL/dr through π
        return g_r, g_t if ctx.needs_input_grad[1] else None, None, None, None, None


def gate_weights(
    r: Tensor, t: Tensor | None, idx: Tensor, mask: Tensor, kind: str, scores: Tensor | None = None
) -> Tensor:
    """The weights of the used slots: r [T, N] logits, t [T, N] tangent (None: no straight-through
    gradient), idx [T, kmax] long, mask [T, kmax] bool, kind "softmax" or "sigmoid" -> [T, kmax].
    scores: the caller's π = softmax(r) or sigmoid(r) [T, N], detached, to save computing it again
    in the forward (the backward recomputes it from r)."""
    if t is None or not torch.is_grad_enabled():
        return reference(r, t, idx, mask, kind)
    return GateWeights.apply(r, t, idx, mask, kind, scores)
