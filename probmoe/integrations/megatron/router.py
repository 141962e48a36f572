"""``ProbMoEMegatronRouter``: ProbMoE routing behind Megatron-Core's ``RouterInterface``
(``megatron.core.transformer.moe.moe_layer``, megatron-core 0.16.1).

Megatron's own ``TopKRouter`` moves its weight to ``torch.cuda.current_device()`` and fails without
CUDA; this router is a plain ``nn.Module`` (no Megatron base class) that reads the routing options
of Megatron's ``TransformerConfig`` and keeps their meaning:

    num_moe_experts, hidden_size     E, H
    moe_router_topk                  kmax (Exact-k: exactly that many; ``kmin``: Dynamic-k)
    moe_router_score_function        "softmax" or "sigmoid": the scores π the used experts get
    moe_router_pre_softmax           softmax: False (Megatron's default) renormalises π over the used
                                     experts, True keeps softmax(r) over all E; sigmoid renormalises
                                     when topk > 1, as Megatron
    moe_router_topk_scaling_factor   multiplies the weights
    moe_router_num_groups,           group-limited: subsets from at most group_topk of num_groups
    moe_router_group_topk            groups (``circuits.GroupLimited``, an exact constraint on P(S))
    moe_router_enable_expert_bias    an ``expert_bias`` [E] buffer (float32) added to the logits
                                     that define P(S); the weights stay π(r). Megatron updates it:
                                     ``finalize_model_grads`` reads ``local_tokens_per_expert`` [E]
                                     (float32, not saved), which this router fills as Megatron's
                                     ``TopKRouter._apply_expert_bias`` does (under grad, the tokens
                                     whose ``padding_mask`` is True left out) but with the used
                                     slots only: a Dynamic-k token's unused slots are not counted
    init_method                      initialises the gate weight [E, H]

Options this router does not implement are one ValueError naming them: token dropping
(``moe_expert_capacity_factor``), Megatron's aux, sequence and z-losses (nonzero coefficients),
input jitter, sinkhorn routing, forced load balancing.

forward(input [S, B, H], padding_mask=None) -> (probs [S·B, E] float32: the weights at the used
experts, 0 elsewhere, differentiable; routing_map [S·B, E] bool). ``routing_map`` marks all kmax
slots of each token, a Dynamic-k token's unused ones too (the routing contract: distinct experts
at weight 0), so every row has exactly kmax experts: Megatron's dropless dispatchers size their
buffers as tokens × moe_router_topk. The unused slots are computed at weight 0 (value and
gradients unchanged, the work of a full top-kmax). ``padding_mask`` ([S, B]) only leaves tokens out
of ``local_tokens_per_expert``, where it is True, as Megatron's ``_apply_expert_bias`` does (its
docstrings call True the real tokens, its code masks them out): padded tokens are routed like the others.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import circuits
import probmoe
from probmoe.integrations.scale_out import rank_seed
from probmoe.methods import Gate
from probmoe.methods.probmoe import route_probmoe
from probmoe.replay import GeneratorReplay
from probmoe.scores import dense_selection


class ProbMoEMegatronRouter(nn.Module):
    """ProbMoE routing as a Megatron-Core ``RouterInterface`` (see the module docstring)."""

    def __init__(
        self,
        *,
        config,
        pg_collection=None,
        kmin: int | None = None,
        estimator: str | None = None,
        algorithm: str | None = None,
        grad: str = "exact",
        seed: int | None = None,
        method: str | None = None,
        backend: str | None = None,
    ):
        super().__init__()
        words = dict(estimator=estimator, algorithm=algorithm, method=method, backend=backend)  # RoutingConfig's
        _check_unsupported(config)
        E, K = config.num_moe_experts, config.moe_router_topk
        self.config, self.num_experts, self.topk, self.layer_number = config, E, K, None
        self.scaling = config.moe_router_topk_scaling_factor
        self.score_function = config.moe_router_score_function
        self.routing = routing_config(config, kmin=kmin, grad=grad, **words)
        self.weight = nn.Parameter(torch.empty(E, config.hidden_size, dtype=torch.float32))
        config.init_method(self.weight)
        if config.moe_router_enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32), persistent=True)
            self.register_buffer("local_tokens_per_expert", torch.zeros(E, dtype=torch.float32), persistent=False)
        else:
            self.expert_bias = self.local_tokens_per_expert = None
        self.seed, self._generator, self._replay = seed, None, GeneratorReplay()
        self.last_routing: probmoe.Routing | None = None

    def set_layer_number(self, layer_number: int) -> None:
        self.layer_number = layer_number

    @property
    def generator(self) -> torch.Generator | None:
        """A generator seeded per global rank (s · 1,000,003 + rank), made on first use; None: torch's."""
        if self.seed is not None and self._generator is None:
            self._generator = torch.Generator(device=self.weight.device).manual_seed(rank_seed(self.seed))
        return self._generator

    def forward(self, input: Tensor, padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self._keep_float32()
        logits = F.linear(input.reshape(-1, input.shape[-1]).float(), self.weight.float())  # [S·B, E]
        generator = self.generator if self.training else None
        gate = Gate(
            top_k=self.topk,
            num_experts=self.num_experts,
            normalize=self.routing.normalize,
            scores=self.score_function,
            routing=self.routing,
            generator=generator,
            replay=self._replay,
            bias=self.expert_bias,
        )  # P(S) from the logits shifted by the expert bias, the weights from the unbiased scores
        routing, w = route_probmoe(logits, gate, self.training)  # [T, K]
        self.last_routing = routing
        if self.scaling:
            w = w * self.scaling
        probs = torch.zeros_like(logits).scatter(-1, routing.indices, w)  # [T, E], differentiable
        routing_map = dense_selection(routing.indices, torch.ones_like(routing.mask), self.num_experts)
        if self.expert_bias is not None and torch.is_grad_enabled():
            self._count_used_slots(routing, padding_mask)
        return probs, routing_map

    @torch.no_grad()
    def _count_used_slots(self, routing: probmoe.Routing, padding_mask: Tensor | None) -> None:
        """Megatron's ``_apply_expert_bias`` on the used slots: the tokens per expert of this batch."""
        used = routing.selected()  # [T, E] bool, a Dynamic-k token's unused slots False
        if padding_mask is not None:
            used = used & ~padding_mask.reshape(-1, 1)
        self.local_tokens_per_expert += used.sum(0)

    def _load_from_state_dict(self, *args, **kwargs):
        self._keep_float32()  # as Megatron's TopKRouter: a float32 bias is loaded into float32
        return super()._load_from_state_dict(*args, **kwargs)

    def _keep_float32(self) -> None:
        """Megatron's ``Float16Module`` casts buffers to bf16/fp16: the bias and the counts stay float32."""
        for buffer in (self.expert_bias, self.local_tokens_per_expert):
            if buffer is not None and buffer.dtype != torch.float32:
                buffer.data = buffer.data.float()


def probmoe_router(**options):
    """A Megatron ``RouterBuilder`` (``MoESubmodules(router=probmoe_router(kmin=2, seed=0))``)."""
    return functools.partial(ProbMoEMegatronRouter, **options)


def routing_config(
    config, *, kmin, estimator=None, algorithm=None, grad="exact", method=None, backend=None
) -> probmoe.RoutingConfig:
    """The ``probmoe.RoutingConfig`` for a Megatron ``TransformerConfig``; ValueError naming the field."""
    E, K = config.num_moe_experts, config.moe_router_topk
    if not isinstance(E, int) or E < 1:
        raise ValueError(f"num_moe_experts must be an int >= 1, got {E!r}")
    if not isinstance(K, int) or not 1 <= K <= E:
        raise ValueError(f"moe_router_topk (kmax) must be in 1..num_moe_experts = {E}, got {K!r}")
    kmin = K if kmin is None else kmin
    if not isinstance(kmin, int) or not 1 <= kmin <= K:
        raise ValueError(f"kmin must be in 1..moe_router_topk = {K}, got {kmin!r}")
    score = config.moe_router_score_function
    if score not in ("softmax", "sigmoid"):
        raise ValueError(f"moe_router_score_function must be 'softmax' or 'sigmoid', got {score!r}")
    normalize = (not config.moe_router_pre_softmax) if score == "softmax" else K > 1
    given = dict(
        estimator=estimator, algorithm=algorithm, method=method, backend=backend
    )  # the old words: RoutingConfig's
    words = {name: value for name, value in given.items() if value is not None}
    fields = dict(**words, grad=grad, normalize=normalize, scores=score)
    groups, limited = config.moe_router_num_groups, config.moe_router_group_topk
    if not groups:
        return probmoe.RoutingConfig(E, kmin=kmin, kmax=K, **fields)
    if E % groups or not limited or not 1 <= limited <= groups or limited * (E // groups) < K:
        raise ValueError(
            f"moe_router_num_groups = {groups} must divide num_moe_experts = {E} and "
            f"moe_router_group_topk = {limited} groups must hold moe_router_topk = {K} experts"
        )
    spec = circuits.GroupLimited(E, None, groups, limited, kmin=kmin, kmax=K)
    return probmoe.RoutingConfig(E, constraint=spec, **{**fields, "backend": None, "algorithm": "circuit"})


def _check_unsupported(config) -> None:
    unsupported = {
        "moe_expert_capacity_factor": config.moe_expert_capacity_factor is not None,
        "moe_z_loss_coeff": bool(config.moe_z_loss_coeff),
        "moe_input_jitter_eps": bool(config.moe_input_jitter_eps),
        "moe_router_force_load_balancing": bool(config.moe_router_force_load_balancing),
        "moe_router_load_balancing_type='sinkhorn'": config.moe_router_load_balancing_type == "sinkhorn",
        "moe_aux_loss_coeff": bool(config.moe_aux_loss_coeff),
    }
    bad = [name for name, on in unsupported.items() if on]
    if bad:
        raise ValueError(
            f"ProbMoEMegatronRouter does not implement {', '.join(bad)}: unset them (ProbMoE's own "
            "balancing: the expert bias, moe_router_enable_expert_bias)"
        )
