"""``gate_weights``: the routing weights of Eq. 7 at the used slots, as one autograd step: the last
step of ``route``'s composed path (where a training route is not one ``circuits::chosen_scores``
call: float64, CUDA, no C kernels, structured constraints, the ablations, eval).

    w = where(mask, π.gather(idx) · (1 + t.gather(idx)), 0)        π = softmax(r) or sigmoid(r)

where t is the zero-valued tangent carrying the straight-through gradient (``SubsetDistribution.
mean_tangent``). Written out with torch operations (``reference``, the oracle of the tests) the
graph keeps π [T, N], the gather indices twice and the products' operands: 2.5 MiB at T = 4096,
N = 64, k = 8, on top of the logits the marginals keep. ``GateWeights`` keeps only the logits
(the same storage the marginals keep), the indices as int32 and the mask, and recomputes π in the
backward: 1.3 MiB in all for that call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .scores import gate_scores


def reference(r: Tensor, t: Tensor | None, idx: Tensor, mask: Tensor, kind: str) -> Tensor:
    """The plain torch meaning: r, t [T, N]; idx [T, kmax] long; mask [T, kmax] bool -> w [T, kmax]."""
    w = gate_scores(r, kind).gather(-1, idx)
    if t is not None:
        w = w * (1 + t.gather(-1, idx))
    return torch.where(mask, w, 0.0)


class GateWeights(torch.autograd.Function):
    """``reference`` with a smaller graph (same value; gradients equal up to rounding)."""

    @staticmethod
    def forward(ctx, r: Tensor, t: Tensor, idx: Tensor, mask: Tensor, kind: str, p: Tensor | None = None) -> Tensor:
        p = gate_scores(r, kind) if p is None else p  # [T, N]
        w = torch.where(mask, p.gather(-1, idx), 0.0)  # [T, kmax]; t's value is 0
        ctx.kind = kind
        ctx.save_for_backward(r, idx.to(torch.int32), mask)
        return w

    @staticmethod
    def backward(ctx, gw: Tensor):
        r, idx32, mask = ctx.saved_tensors
        idx = idx32.long()
        p = gate_scores(r, ctx.kind)  # [T, N], recomputed
        g = torch.where(mask, gw, 0.0)  # [T, kmax]; unused slots carry no gradient
        g_p = torch.zeros_like(p).scatter_add_(-1, idx, g)  # dL/dπ [T, N] (used slots are distinct experts)
        # d w / d t at a used slot is π there (t = 0): dL/dt = dL/dπ · π
        g_t = g_p.mul_(p)  # [T, N], in place: dL/dπ is not needed on its own below
        if ctx.kind == "softmax":  # softmax backward, π (dL/dπ - Σ π dL/dπ), in one fused step
            g_r = torch.addcmul(g_t, p, g_t.sum(dim=-1, keepdim=True), value=-1)
        else:
            g_r = g_t * (1 - p)  # sigmoid backward
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
