"""probmoe's registered torch operators (``torch.ops.probmoe``): the cardinality DP.

    dp_marginals(r, seed, kmin, kmax, values) -> (m [T, N] (zeros unless ``values``), one draw
                                                  z [T, N] when a seed is given, else [0])
                                                  d/dr of m: Cov(z) v (``dp_cov_vec``)
    dp_cov_vec(r, v, kmin, kmax)              -> Cov(z) v [T, N]

r: logits [T, N], float32 or float64, checked by the caller; seed: a 0-dim int64 tensor
(``circuits.native.uniforms``). The kernels are ``probmoe.dp.Cardinality``'s: the fused C DP for
float32 CPU tensors when its library is built, the torch sweeps otherwise. As operators with fake
implementations and registered autograd, torch.compile traces routing through them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .dp import Cardinality


@torch.library.custom_op("probmoe::dp_marginals", mutates_args=())
def dp_marginals(r: Tensor, seed: Tensor | None, kmin: int, kmax: int, values: bool) -> tuple[Tensor, Tensor]:
    m, z = Cardinality(kmin, kmax).forward_marginals(r, seed, values)
    return m.contiguous(), z.contiguous()  # the torch sweeps build them transposed


@dp_marginals.register_fake
def _(r, seed, kmin, kmax, values):
    return torch.empty_like(r), r.new_empty(r.shape if seed is not None else (0,))


def _setup(ctx, inputs, output):
    r, _, kmin, kmax, _ = inputs
    ctx.sizes = (kmin, kmax)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(r)  # the caller's logits: no copy


def _backward(ctx, v, _z):
    """The marginals' Jacobian is Cov(z), symmetric: the backward is one product Cov(z) v."""
    (r,) = ctx.saved_tensors
    return torch.ops.probmoe.dp_cov_vec(r, v.contiguous(), *ctx.sizes), None, None, None, None


dp_marginals.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("probmoe::dp_cov_vec", mutates_args=())
def dp_cov_vec(r: Tensor, v: Tensor, kmin: int, kmax: int) -> Tensor:
    return Cardinality(kmin, kmax).cov_vec(r, v).contiguous()


@dp_cov_vec.register_fake
def _(r, v, kmin, kmax):
    return torch.empty_like(r)
