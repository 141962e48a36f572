"""The inference rules, as vLLM routing functions (``FusedMoE(custom_routing_function=...)``).

Each routing function takes the router logits r [T, N] and returns (weights [T, slots] float32, ids
[T, slots] int32). The rules are the methods' own (``probmoe.methods``), the same functions the
transformers integration routes with at eval: ``Method.infer_rule``, plain torch with static
shapes (no ``.item()``, no data-dependent Python branch, so a CUDA graph can capture it), every
row's ids distinct, unused slots at weight exactly 0. A rule of kind "topk" is the stock top-k with
a selection bias (``probmoe.methods.topk.topk_rule``), whatever the method; any other kind is the
method's own inference rule. The names below are the rules' aliases, kept for their importers:

    topk_bias(r, b, k, normalize)              the top-k of π + b, weights π
    range_map(r, b, kmin, kmax, normalize)     ProbMoE's MAP (``probmoe.methods.probmoe.map_rule``)
    sparsemixer_eval(r, k, eps)                SparseMixer v2's eval (``sparsemixer_weights``)
    relu_all(r)                                ReMoE's ReLU gates over every expert

``bias`` is float32 [N] or None.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor

from probmoe.methods import Gate, get_method
from probmoe.methods.probmoe import range_map as _range_map
from probmoe.methods.remoe import relu_all as _relu_all
from probmoe.methods.sparsemixer import sparsemixer_weights
from probmoe.methods.topk import topk_rule


def _ids(idx: Tensor) -> Tensor:
    return idx.to(torch.int32).contiguous()


def topk_bias(logits: Tensor, bias: Tensor | None, k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """Top-k of softmax(r) + b, weights softmax(r) at the chosen: [T, N] -> ([T, k], [T, k] int32)."""
    w, idx = topk_rule(logits, k, normalize, "softmax", bias)
    return w, _ids(idx)


def range_map(logits: Tensor, bias: Tensor | None, kmin: int, kmax: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """ProbMoE's MAP: [T, N] -> ([T, kmax], [T, kmax] int32); unused slots weight 0."""
    w, idx = _range_map(logits, bias, kmin, kmax, normalize)
    return w, _ids(idx)


def sparsemixer_eval(logits: Tensor, k: int, jitter_eps: float) -> tuple[Tensor, Tensor]:
    """SparseMixer v2's deterministic eval routing: [T, N] -> ([T, k], [T, k] int32)."""
    w, idx = sparsemixer_weights(logits, k, training=False, jitter_eps=jitter_eps)
    return w, _ids(idx)


def relu_all(logits: Tensor) -> tuple[Tensor, Tensor]:
    """ReMoE's ReLU routing over every expert: [T, N] -> ([T, N], [T, N] int32)."""
    w, idx = _relu_all(logits)
    return w, _ids(idx)


def routing_function(rule, bias: Tensor | None, scale: float = 1.0):
    """The vLLM ``custom_routing_function`` of a ``settings.Rule`` (with one layer's bias [N]), its
    weights times ``scale`` (DeepSeek-V3's routed_scaling_factor where vLLM leaves it to the router)."""
    slots, normalize = rule.slots, rule.normalize
    if rule.kind == "topk":

        def rule_of(logits: Tensor) -> tuple[Tensor, Tensor]:
            w, idx = topk_rule(logits, slots, normalize, rule.scores, bias)
            return w, _ids(idx)

    else:
        method = get_method(rule.method)
        gate = Gate(
            top_k=slots,
            num_experts=rule.num_experts,
            normalize=normalize,
            scores=rule.scores,
            options=SimpleNamespace(**{**method.options, **rule.options}),
            k=slots,
            kmin=rule.kmin,
            bias=bias,
        )

        def rule_of(logits: Tensor) -> tuple[Tensor, Tensor]:
            out = method.infer_rule(logits, gate)
            return out.weights.float(), _ids(out.indices)

    def route(hidden_states: Tensor, gating_output: Tensor, topk: int, renormalize: bool):
        # topk / renormalize are vLLM's (the config's); the rule's own values decide
        w, ids = rule_of(gating_output)
        return (w * scale if scale != 1.0 else w), ids

    route.probmoe_rule = rule
    return route
