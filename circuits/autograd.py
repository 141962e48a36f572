"""The autograd contract of an exact distribution over binary vectors, written once.

P(x | C) ∝ exp(r · x) over the x in {0, 1}^n that satisfy a constraint C, given logits r [T, n].
Its marginals m = P(x_i = 1 | C) have the Jacobian dm/dr = Cov(x), which is symmetric, so the
backward of m is one product Cov(x) v. Any exact model of such a distribution (a compiled
circuit, probmoe's cardinality dynamic program) plugs into ``ExactMarginals`` by offering:

    model.forward_marginals(r, want_sample, generator, values) -> (m [T, n], z [T, n], keep)
        the marginals (zeros when ``values`` is False: the caller wants only their Jacobian),
        one exact draw (an empty tensor when not wanted), and the tensors the backward needs, a
        tuple (r itself where it can: a caller that also keeps r then shares its storage; e.g.
        (r, shift [T, 1]) for a circuit that evaluates shifted logits);
    model.cov_vec(keep, v) -> Cov(x) v [T, n], recomputed from the tuple ``keep`` alone.

So the graph keeps O(T n) per call whatever the model's intermediate size. ``LogPartition`` adds
log Z for a model that also offers ``log_z_and_marginals(r, marginals)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


class ExactMarginals(torch.autograd.Function):
    """``ExactMarginals.apply(model, r, want_sample, generator, values=True)`` -> (m, z).

    r [T, n] -> m [T, n] (differentiable: backward Cov(x) v; not twice differentiable) and
    z [T, n] in {0, 1} or an empty tensor (not differentiable). Saves only the model's ``keep``.
    """

    @staticmethod
    def forward(ctx, model, r: Tensor, want_sample: bool, generator, values: bool = True):
        m, z, keep = model.forward_marginals(r, want_sample, generator, values)
        ctx.model = model
        ctx.save_for_backward(*keep)
        ctx.mark_non_differentiable(z)
        return m, z

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v: Tensor, _):
        return None, ctx.model.cov_vec(ctx.saved_tensors, v.contiguous()), None, None, None


class LogPartition(torch.autograd.Function):
    """``LogPartition.apply(model, r)``: log Z(r) [T, n] -> [T], with d log Z / d r = m - sigmoid(r)
    (log Z in the normalised form log P_indep(C), leaves log sigmoid(r) and log sigmoid(-r)).

    When a gradient is needed the forward gets m in the same call and saves it, so the backward is
    one product; under create_graph the backward recomputes m through ``ExactMarginals`` (double
    backward works). Saves O(T n).
    """

    @staticmethod
    def forward(ctx, model, r: Tensor) -> Tensor:
        log_z, m = model.log_z_and_marginals(r, ctx.needs_input_grad[1])  # [T], [T, n] or None
        ctx.model = model
        ctx.save_for_backward(r, m)
        return log_z

    @staticmethod
    def backward(ctx, grad: Tensor):
        r, m = ctx.saved_tensors
        if torch.is_grad_enabled():
            m, _ = ExactMarginals.apply(ctx.model, r, False, None)
        return None, grad.unsqueeze(-1) * (m - torch.sigmoid(r))
