"""The ProbMoE methods: routed by ``probmoe.route`` with a ``probmoe.RoutingConfig`` (its estimator
and sizes), training and eval; one class, one registered instance per name.

    "probmoe"            Exact-k (training: sampled, Eq. 7; eval: MAP = the top-k of r: the
                         stock top-k of the softmax families; on DeepSeek-V3 the top-k of its
                         sigmoid scores without expert groups or e_score_correction_bias)
    "probmoe-dynamic"    Dynamic-k over kmin..kmax (eval: MAP, clamp(#{r > 0}, kmin, kmax))
    "sample-dense-ste", "topk-marginal"   the paper's two ablations (Exact-k; eval: MAP)
    "probmoe-grouped"    (grouped families: DeepSeek-V3) exactly k experts from at most topk_group
                         of the n_group expert groups, the model's own limit (eval: MAP)

With a selection bias b (aux-free balancing) the subsets are those of r + b and the weights the
unbiased π(r) (``balance.unbiased_weights``). The inference rule for serving (``infer_rule``,
``range_map``) is the MAP in plain torch with static shapes; the training frameworks' eval goes
through ``probmoe.route``'s MAP (``rule``), which it equals (tests/integrations/test_vllm_rules.py).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from probmoe.router import routed
from probmoe.scores import gate_scores, normalized

from .balance import unbiased_weights
from .base import Gate, Method, Routed, Serving
from .registry import register_method


def route_probmoe(logits: Tensor, gate: Gate, training: bool):
    """``probmoe.route`` of logits [T, N] by ``gate.routing``, with ``gate.bias`` shifting the
    selection: (routing, weights [T, kmax])."""
    if gate.bias is None:
        routing = routed(
            logits, gate.routing, training=training, generator=gate.generator, replay=gate.replay, validate_args=False
        )  # as the stock router: no host sync
        return routing, routing.weights
    shifted = logits.float() + gate.bias
    routing = routed(
        shifted,
        dataclasses.replace(gate.routing, normalize=False),
        training=training,
        generator=gate.generator,
        replay=gate.replay,
        validate_args=False,
    )
    return routing, unbiased_weights(routing, logits, shifted, gate.scores, gate.routing.normalize)


def range_map(
    logits: Tensor, bias: Tensor | None, kmin: int, kmax: int, normalize: bool, scores: str = "softmax"
) -> tuple[Tensor, Tensor]:
    """``map_rule``'s (weights, ids)."""
    return map_rule(logits, bias, kmin, kmax, normalize, scores)[:2]


def map_rule(
    logits: Tensor, bias: Tensor | None, kmin: int, kmax: int, normalize: bool, scores: str = "softmax"
) -> tuple[Tensor, Tensor, Tensor]:
    """The MAP in plain torch, static shapes: [T, N] -> (weights [T, kmax] float32, ids [T, kmax]
    long, used [T, kmax] bool): ids = topk(r + b, kmax) (descending, distinct), used = the first clamp(#{r + b > 0}, kmin,
    kmax) slots, w = π(r)[ids] on used slots, 0 elsewhere (renormalised over the used ones if
    asked); exactly k when kmin = kmax. π: the gate ``scores`` (softmax; sigmoid for DeepSeek-V3,
    whose MAP has no expert groups and no e_score_correction_bias beyond an aux-free ``bias``)."""
    r = logits.float()  # [T, N]
    probs = gate_scores(r, scores)
    shifted = r if bias is None else r + bias
    idx = shifted.topk(kmax, dim=-1).indices  # [T, kmax], descending, distinct
    size = (shifted > 0).sum(dim=-1).clamp(kmin, kmax)  # [T]
    used = torch.arange(kmax, device=r.device) < size.unsqueeze(-1)  # [T, kmax]
    w = probs.gather(-1, idx)
    if bias is not None:  # as route_probmoe: π(r + b) / π(r + b) · π(r) at the used slots
        w_shifted = gate_scores(shifted, scores).gather(-1, idx)
        w = w_shifted / w_shifted.clamp_min(torch.finfo(torch.float32).tiny) * w
    w = torch.where(used, w, 0.0)
    return (normalized(w) if normalize else w), idx, used


class ProbMoE(Method):
    """A ProbMoE method: ``estimator`` and ``sizes`` (and ``groups``) say which."""

    def __init__(self, name: str, summary: str, estimator: str, sizes: str = "exact-k", groups: str = "any"):
        self.name, self.summary, self.estimator, self.sizes, self.groups = name, summary, estimator, sizes, groups
        self.experts = "skip" if sizes == "range" else None  # unused slots are skipped by the experts
        self.dense_training = estimator == "sample-dense-ste"  # as the memory estimate has counted it

    def rule(self, logits: Tensor, gate: Gate, training: bool) -> Routed:
        routing, weights = route_probmoe(logits, gate, training)
        return Routed(weights, routing.indices, routing.indices.detach(), routing.mask, routing)

    def train_rule(self, logits: Tensor, gate: Gate) -> Routed:
        return self.rule(logits, gate, True)

    def infer_rule(self, logits: Tensor, gate: Gate) -> Routed:
        kmax = gate.k if gate.k is not None else gate.routing.kmax
        kmin = gate.kmin if gate.kmin is not None else gate.routing.kmin
        w, idx, used = map_rule(logits, gate.bias, kmin, kmax, gate.normalize, gate.scores)
        return Routed(w, idx, idx, used)

    def serving(self, routing, top_k: int, num_experts: int, biased: bool) -> Serving | None:
        if routing.constraint is not None:
            return None  # the circuit's MAP: no static-shape form here
        if routing.k is not None and not biased and routing.scores == "softmax":
            return Serving("topk", routing.k, routing.k)  # MAP = top-k: stock
        # sigmoid scores (DeepSeek-V3): the MAP is the top-k of r without the family's groups and
        # e_score_correction_bias, not its stock router
        # a range, or exactly k with the aux-free bias: the bias shifts the logits (the MAP of r + b), not π
        return Serving("range", routing.kmax, routing.kmin)


for _method in (
    ProbMoE("probmoe", "ProbMoE Exact-k (training: sampled, Eq. 7; eval: MAP = stock top-k)", "probmoe"),
    ProbMoE(
        "probmoe-dynamic",
        "ProbMoE Dynamic-k over kmin..kmax (eval: MAP, clamp(#{r > 0}, kmin, kmax))",
        "probmoe",
        sizes="range",
    ),
    ProbMoE(
        "sample-dense-ste", "ablation: sampled forward, softmax (dense) straight-through backward", "sample-dense-ste"
    ),
    ProbMoE("topk-marginal", "ablation: MAP (top-k) forward, marginal backward", "topk-marginal"),
):
    register_method(_method)
GROUPED = ProbMoE(
    "probmoe-grouped",
    "ProbMoE on exactly k experts from at most topk_group of the n_group expert groups (grouped families)",
    "probmoe",
    groups="only",
)  # registered after the other built-ins (probmoe/methods/__init__.py): the grouped families' own
