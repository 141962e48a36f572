"""The straight-through selection of ``circuits::chosen_scores`` in plain torch: its meaning and
the oracle of its kernels (``circuits.ops``, the fused C DP in ``c/cardinality.c``).

Given logits r [T, n], a constraint C and one draw z ~ P(z | C, r), the operator returns, for the
drawn variables ordered by their score (descending, ties to the lower index), the scores
π = softmax(r) or sigmoid(r) at them, with the straight-through gradient

    w = π_S ⊙ (1 + t_S),   t = stopgrad(-m) + m,   m = P(z_i = 1 | C, r) (Jacobian Cov(z))

so that the value is π at the drawn variables and the gradient flows through π and through the
exact marginals (Cov(z) (g ⊙ π at S), or Cov(z) diag(1 - sigmoid(r)) times it in the "paper"
convention). ``reference`` writes this out given the draw and a zero-valued tangent t.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .rows import topk_chosen_reference

KINDS = ("softmax", "sigmoid")


def scores(r: Tensor, kind: str) -> Tensor:
    """The scores π of logits r [T, n]: softmax over the last dimension ("softmax") or sigmoid
    ("sigmoid"): [T, n]."""
    if kind == "softmax":
        return torch.softmax(r, dim=-1)
    if kind == "sigmoid":
        return torch.sigmoid(r)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def reference(r: Tensor, z: Tensor, tangent: Tensor, slots: int, kind: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The operator written out: r [T, n] logits (differentiable), z [T, n] the draw in {0, 1},
    tangent [T, n] zeros whose Jacobian is the marginals' (e.g. m - m.detach()), 1 <= slots <= n
    -> (weights [T, slots], indices [T, slots] long, mask [T, slots] bool, π [T, n] detached), in
    the operator's order.
    Slots past the draw's size hold the lowest undrawn variables, ascending (so no row repeats a
    variable), weight 0 and mask False."""
    p = scores(r, kind)
    top, idx = topk_chosen_reference(z.to(p.dtype), p.detach(), slots)  # the drawn by π, then the rest by index
    mask = top >= 0
    w = torch.where(mask, p.gather(-1, idx) * (1 + tangent.gather(-1, idx)), 0.0)
    return w, idx, mask, p.detach()
