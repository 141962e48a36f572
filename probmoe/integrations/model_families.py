"""The MoE model families probmoe patches, trains and serves: one row each, the one home of their facts.

A plain table (no torch, transformers or vllm import), read by the transformers integration
(``transformers.families``: how to find and check the blocks; ``transformers.testing``: the tiny
configs), the vLLM plugin (``vllm.settings``: the expert-count field and the normalisation;
``vllm``, ``vllm.models``: the architectures it registers) and the experiments (``--model tiny-*``).

A new family whose blocks have a known layout (a ``*TopKRouter`` returning ``(logits, weights,
indices)`` and a fused ``*Experts``; see ``transformers.families``) is one row here plus its tests;
``vllm_module`` set (vLLM's module of the architecture) also serves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class FamilyFacts:
    """One model family.

    model_type: ``config.model_type``.
    prefix: the class-name prefix in ``transformers.models.<model_type>.modeling_<model_type>``.
    experts_attr: the config field holding the number of routed experts.
    always_normalize: the router always renormalises its top-k weights (Mixtral); otherwise it
        follows ``config.norm_topk_prob``.
    fp32_weights: the router returns float32 weights whatever the logits' dtype (Mixtral,
        DeepSeek-V3); the others cast their weights to the logits' dtype.
    router, block: the router and block class names without the prefix.
    fp32_logits: the router computes its logits in float32 whatever the hidden states' dtype
        (DeepSeek-V3); the others in the hidden states' dtype.
    scores: the gate scores the used experts are weighted by: "softmax" or "sigmoid"
        (``probmoe.RoutingConfig.scores``).
    grouped: the router limits each token to ``config.topk_group`` of ``config.n_group`` expert
        groups, and scales the used weights by ``config.routed_scaling_factor``.
    tiny: the config fields of the family's tiny test model beyond the shared small widths
        (``transformers.testing.COMMON``): its expert count and what else its config needs, as
        (field, value) pairs (``dict(facts.tiny)``; a tuple, so that a patched model that carries its
        family pickles).
    vllm_module: the module of ``vllm.model_executor.models`` that holds the family's
        ``architecture`` (None: the vLLM plugin does not register it).
    """

    model_type: str
    prefix: str
    experts_attr: str
    always_normalize: bool
    fp32_weights: bool
    router: str = "TopKRouter"
    block: str = "SparseMoeBlock"
    fp32_logits: bool = False
    scores: str = "softmax"
    grouped: bool = False
    tiny: tuple = ()
    vllm_module: str | None = None

    @property
    def architecture(self) -> str:
        """The causal-LM class name (transformers' and vLLM's): ``<prefix>ForCausalLM``."""
        return f"{self.prefix}ForCausalLM"

    @property
    def tiny_name(self) -> str:
        """The ``--model`` name of the family's tiny model: ``tiny-`` + the model type with dashes."""
        return "tiny-" + self.model_type.replace("_", "-")


def _facts(model_type: str, prefix: str, experts_attr: str, *, tiny: dict, **kw) -> FamilyFacts:
    return FamilyFacts(model_type, prefix, experts_attr, tiny=tuple(tiny.items()), **kw)


TABLE = MappingProxyType(
    {
        f.model_type: f
        for f in (
            _facts(
                "olmoe",
                "Olmoe",
                "num_experts",
                always_normalize=False,
                fp32_weights=False,
                tiny=dict(num_experts=8),
                vllm_module="olmoe",
            ),
            _facts(
                "qwen2_moe",
                "Qwen2Moe",
                "num_experts",
                always_normalize=False,
                fp32_weights=False,
                tiny=dict(num_experts=8, moe_intermediate_size=128, shared_expert_intermediate_size=128),
                vllm_module="qwen2_moe",
            ),
            _facts(
                "qwen3_moe",
                "Qwen3Moe",
                "num_experts",
                always_normalize=False,
                fp32_weights=False,
                tiny=dict(num_experts=8, moe_intermediate_size=128),
                vllm_module="qwen3_moe",
            ),
            _facts(
                "mixtral",
                "Mixtral",
                "num_local_experts",
                always_normalize=True,
                fp32_weights=True,
                tiny=dict(num_local_experts=8),
                vllm_module="mixtral",
            ),
            _facts(  # FlexOlmo (OLMoE's layout); vLLM runs it through its transformers backend only
                "flex_olmo",
                "FlexOlmo",
                "num_experts",
                always_normalize=False,
                fp32_weights=False,
                tiny=dict(num_experts=8),
            ),
            _facts(
                "deepseek_v3",
                "DeepseekV3",
                "n_routed_experts",
                always_normalize=False,
                fp32_weights=True,
                router="TopkRouter",
                block="MoE",
                fp32_logits=True,
                scores="sigmoid",
                grouped=True,
                # 3 layers, the first dense; 8 experts in 4 groups of 2, at most 2 groups, top-3 (so
                # that the group limit binds); MLA with kv_lora_rank 16 and no q LoRA.
                tiny=dict(
                    n_routed_experts=8,
                    n_shared_experts=1,
                    n_group=4,
                    topk_group=2,
                    num_experts_per_tok=3,
                    moe_intermediate_size=64,
                    num_hidden_layers=3,
                    first_k_dense_replace=1,
                    num_attention_heads=4,
                    num_key_value_heads=4,
                    q_lora_rank=None,
                    kv_lora_rank=16,
                    qk_rope_head_dim=8,
                    qk_nope_head_dim=8,
                    v_head_dim=16,
                    routed_scaling_factor=2.5,
                    norm_topk_prob=True,
                ),
                vllm_module="deepseek_v2",
            ),
        )
    }
)
GROUPED = tuple(name for name, f in TABLE.items() if f.grouped)
SUPPORTED = tuple(name for name, f in TABLE.items() if not f.grouped)
ALL = SUPPORTED + GROUPED
SERVED = tuple(name for name, f in TABLE.items() if f.vllm_module is not None)
