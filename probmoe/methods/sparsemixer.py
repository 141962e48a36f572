""" "sparsemixer": SparseMixer v2 (Liu et al. 2023; GRIN-MoE, 2024): sparse routing by Gumbel sampling within a
jitter band, with the mid-point (Heun) gradient estimator for the router.

Transcribed from the official ``sparsemixer/sparsemixer_v2.py`` (microsoft/SparseMixer), which is
top-1/top-2 only ("only top-1/2 gating has been tested"); stage j of k (j = 1, 2, ...), on the
scores r [T, N] with the experts chosen in earlier stages removed (-inf):

    band_j   = {i : (max_remaining − r_i) / max(|r_i|, max_remaining) ≤ 2ε}     (ε: jitter_eps)
    p_j      = softmax of the remaining scores inside band_j (−inf outside)       [T, N]
    D_j      = argmax(r + Gumbel) over band_j (training); argmax of the remaining (eval)
    c_j      = 1 if D_j = argmax p_j or u > 0.75 (u ~ U(0, 1)), else 0.3333 (training; eval 1)
    weight_j = p_j[D_j] · c_j            (forward value)
    ∂weight_j/∂r := p_j[D_j] · (e_{D_j} − p_j)   (backward: the midpoint estimator; c_j is
                                                   not differentiated, as in the official code)

The generalisation to k > 2 repeats the official second stage: each stage removes the experts
chosen so far and recomputes the band relative to the largest remaining score (the band's
relative distance is measured against the original scores, as the official second stage does).
For k ≤ 2 it is the official code, draw for draw: per stage a [T, N] exponential for the Gumbel
noise, then the uniform of the midpoint rule, which the official second stage draws as
``torch.rand_like(max_scores).uniform_()``: two [T, 1] uniform draws, the second used
(``sparsemixer_v2.py``, and transformers' PhiMoE ``sparsemixer`` in ``modeling_phimoe.py``); the first
stage draws it once. Stages after the second repeat the second's two draws. So from one seed and
fp32 logits the weights and experts are PhiMoE's ``sparsemixer``'s, bit for bit (tested by calling
it). Logits of another dtype (bf16, fp16) are routed here in fp32 (``logits.float()``; the weights
come back in fp32), while PhiMoE computes in the logits' own dtype: the same random numbers are
drawn (the RNG ends in the same state), but the noisy scores, band and weights are rounded
differently, so the weights are not PhiMoE's bit for bit and where scores nearly tie the experts
can differ too.

ε (``jitter_eps``) defaults to 0.01, GRIN-MoE's ``router_jitter_noise`` (its config and PhiMoE's);
the official ``SparseMixerV2`` class defaults to 0.1. In eval the official v2 function still draws
the midpoint uniform (a no-op on the weights: the chosen expert is the band's argmax, factor 1);
PhiMoE's and ours draw nothing in eval.

The inference rule is ``sparsemixer_weights(training=False)`` itself (stage j takes the largest
remaining logit, weight = the softmax of the remaining logits within its jitter band): plain torch,
static shapes, so vLLM serves the same function.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
from torch import Tensor

from .base import Gate, Method, Routed, Serving
from .registry import register_method

JITTER_EPS = 0.01  # GRIN-MoE's router_jitter_noise (the band half-width ε); SparseMixerV2's default is 0.1


class _Midpoint(torch.autograd.Function):
    """Forward: gate [T, 1] · factor [T, 1]; backward to the scores [T, N]: the incoming gradient
    times gate · (e_chosen − probs). Only the scores get a gradient."""

    @staticmethod
    def forward(ctx, scores: Tensor, gate: Tensor, chosen: Tensor, probs: Tensor, factor: Tensor) -> Tensor:
        ctx.save_for_backward(gate, chosen, probs)
        return gate * factor

    @staticmethod
    def backward(ctx, grad: Tensor):
        gate, chosen, probs = ctx.saved_tensors
        g = grad * gate  # [T, 1]
        d_scores = -probs * g  # [T, N]
        d_scores = d_scores.scatter_add(-1, chosen, g)
        return d_scores, None, None, None, None


def sparsemixer_weights(
    logits: Tensor, k: int, *, training: bool, jitter_eps: float = JITTER_EPS, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """logits [T, N] -> (weights [T, k] float32, indices [T, k] long), stage by stage as above."""
    scores = logits.float()  # [T, N]
    remaining = scores
    weights, indices = [], []
    for stage in range(k):
        with torch.no_grad():
            top, argtop = remaining.max(dim=-1, keepdim=True)  # [T, 1] each
            far = (top - scores) / scores.abs().clamp(min=top) > 2 * jitter_eps  # [T, N]
            banded = remaining.masked_fill(far, float("-inf"))  # [T, N]
            if training:
                noise = torch.empty_like(banded).exponential_(generator=generator).log()  # -Gumbel
                chosen = (banded - noise).argmax(dim=-1, keepdim=True)  # [T, 1]
            else:
                chosen = argtop
            probs = torch.softmax(banded, dim=-1)  # [T, N]
            if training:
                best = probs.argmax(dim=-1, keepdim=True)
                u = torch.rand(best.shape, generator=generator, device=best.device)  # [T, 1]
                if stage > 0:  # the official second stage: torch.rand_like(x).uniform_(), the second draw used
                    u.uniform_(generator=generator)
                factor = 0.3333 + 0.6667 * ((chosen == best) | (u > 0.75)).float()
            else:
                factor = torch.ones_like(top)
            gate = probs.gather(-1, chosen)  # [T, 1]
        weights.append(_Midpoint.apply(scores, gate, chosen, probs, factor))
        indices.append(chosen)
        remaining = remaining.scatter(-1, chosen, float("-inf"))
    return torch.cat(weights, dim=-1), torch.cat(indices, dim=-1)


class SparseMixer(Method):
    name = "sparsemixer"
    summary = (
        "SparseMixer v2: Gumbel sampling within a jitter band, midpoint router gradient (training); "
        "eval: its deterministic top-k (softmax families)"
    )
    groups = "never"
    balances = False
    options = MappingProxyType({"jitter_eps": JITTER_EPS})

    def rule(self, logits: Tensor, gate: Gate, training: bool) -> Routed:
        weights, indices = sparsemixer_weights(
            logits,
            gate.k or gate.top_k,
            training=training,
            jitter_eps=gate.options.jitter_eps,
            generator=gate.generator if training else None,
        )  # [T, k] each
        return Routed(weights, indices)

    def train_rule(self, logits: Tensor, gate: Gate) -> Routed:
        return self.rule(logits, gate, True)

    def infer_rule(self, logits: Tensor, gate: Gate) -> Routed:
        return self.rule(logits, gate, False)

    def serving(self, routing, top_k: int, num_experts: int, biased: bool) -> Serving:
        return Serving("sparsemixer", top_k, top_k, normalizes=False)


register_method(SparseMixer())
