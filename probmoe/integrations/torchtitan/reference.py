"""The dense reference of torchtitan's routed experts: every expert computed on every token, masked by
the routing weights; the oracle the MoE path (dispatch, grouped matmuls, combine, all-to-all) is
tested against.

    out[t] = Σ_e W[t, e] · E_e(x[t]),   W [T, E] = the routing weights scattered to their experts

with E_e torchtitan's ``GroupedExperts`` SwiGLU, w2 (silu(w1 x) ⊙ w3 x), in bfloat16 as it computes
it, the result cast back to x's dtype and weighted in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def expert_outputs(x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """Every expert on every token: x [T, D], w1, w3 [E, F, D], w2 [E, D, F] -> [E, T, D] in x's dtype.
    One expert at a time, casting x to bfloat16 for each product, as ``GroupedExperts`` does (so the
    gradient of x is rounded to bfloat16 per expert and product and summed in x's dtype, as there)."""
    out = []
    for e in range(w1.shape[0]):  # x cast once per product, as GroupedExperts does
        h = F.silu(x.bfloat16() @ w1[e].bfloat16().T) * (x.bfloat16() @ w3[e].bfloat16().T)  # [T, F]
        out.append((h @ w2[e].bfloat16().T).type_as(x))  # [T, D]
    return torch.stack(out)  # [E, T, D]


def dense_moe(x: Tensor, weights: Tensor, indices: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """The routed experts' output: x [..., D], weights / indices [..., K] (the router's), expert weights
    as ``expert_outputs`` -> [..., D]. A repeated id in a row adds its weights (what the weights say);
    torchtitan's MoE needs distinct ids (the routing contract)."""
    D, E = x.shape[-1], w1.shape[0]
    xt = x.reshape(-1, D)  # [T, D]
    w = weights.reshape(xt.shape[0], -1).float()  # [T, K]
    dense = torch.zeros(xt.shape[0], E, dtype=torch.float32, device=x.device)
    dense = dense.scatter_add(-1, indices.reshape(xt.shape[0], -1), w)  # [T, E]
    out = torch.einsum("te,etd->td", dense, expert_outputs(xt, w1, w2, w3).float())  # [T, D]
    return out.to(x.dtype).view(x.shape)
