"""Eq. 7 in plain torch, its one home: the score kinds, the straight-through weights and their
gradient. The oracle of the C code (``pm_tile_scores``, ``pm_slot_tangents``, ``pm_scores_backward``
in ``c/chosen.c``), the composed default of the kernels' fused queries (``Kernels.chosen_backward``)
and the gradient of ``probmoe``'s gate weights (``probmoe.gate_weights``). A public module.

Given logits r [T, n], a constraint C and one draw z ~ P(z | C, r), the drawn variables are ordered
by their score (descending, ties to the lower index) and weighted by the scores
π = softmax(r) or sigmoid(r) (``KINDS``) there, with the straight-through gradient

    w = π_S ⊙ (1 + t_S),   t = stopgrad(-m) + m,   m = P(z_i = 1 | C, r) (Jacobian Cov(z))

so that the value is π at the drawn variables and the gradient flows through π and through the
exact marginals: for a gradient g of the weights, g_t = (g at the used slots, scattered to their
variables) ⊙ π (``slot_tangents``) goes to t, and the scores' backward of g_t (``scores_backward``)
to r directly; the logits' gradient is Cov(z) g_t (or Cov(z) diag(1 - sigmoid(r)) g_t in the
"paper" convention) plus that.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .rows import topk_chosen_reference

KINDS = ("softmax", "sigmoid")


def scores(r: Tensor, kind: str) -> Tensor:
    """The scores π of logits r [..., n]: softmax over the last dimension ("softmax") or sigmoid
    ("sigmoid"): [..., n]."""
    if kind == "softmax":
        return torch.softmax(r, dim=-1)
    if kind == "sigmoid":
        return torch.sigmoid(r)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def weights(p: Tensor, idx: Tensor, mask: Tensor, t: Tensor | None = None) -> Tensor:
    """Eq. 7 at the slots: p [T, n] the scores, idx [T, slots] long, mask [T, slots] bool (the used
    slots), t [T, n] the zero-valued tangent (None: no straight-through gradient) -> w [T, slots] =
    π (1 + t) at the used slots, exactly 0 elsewhere."""
    w = p.gather(-1, idx)
    if t is not None:
        w = w * (1 + t.gather(-1, idx))
    return torch.where(mask, w, 0.0)


def slot_tangents(idx: Tensor, mask: Tensor, g: Tensor, p: Tensor) -> Tensor:
    """The gradient that reaches the tangent t: g_t = (g [T, slots] at the used slots, summed at their
    variables idx [T, slots] (int32 or long)) ⊙ p [T, n] -> [T, n]."""
    g_p = torch.zeros_like(p).scatter_add_(-1, idx.long(), torch.where(mask, g, 0.0).to(p.dtype))
    return g_p.mul_(p)  # d w / d t at a used slot is π there (t = 0)


def scores_backward(g_t: Tensor, p: Tensor, kind: str) -> Tensor:
    """The scores' backward of g_t / π (the gradient the weights send to r through π): softmax
    g_t - π Σ g_t, sigmoid g_t (1 - π): [T, n]."""
    if kind == "sigmoid":
        return g_t * (1 - p)
    return torch.addcmul(g_t, p, g_t.sum(dim=-1, keepdim=True), value=-1)


def reference(r: Tensor, z: Tensor, tangent: Tensor, slots: int, kind: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``circuits::chosen_scores`` written out: r [T, n] logits (differentiable), z [T, n] the draw in
    {0, 1}, tangent [T, n] zeros whose Jacobian is the marginals' (e.g. m - m.detach()), 1 <= slots
    <= n -> (weights [T, slots], indices [T, slots] long, mask [T, slots] bool, π [T, n] detached), in
    the operator's order. Slots past the draw's size hold the lowest undrawn variables, ascending
    (so no row repeats a variable), weight 0 and mask False."""
    p = scores(r, kind)
    top, idx = topk_chosen_reference(z.to(p.dtype), p.detach(), slots)  # the drawn by π, then the rest by index
    mask = top >= 0
    return weights(p, idx, mask, tangent), idx, mask, p.detach()
