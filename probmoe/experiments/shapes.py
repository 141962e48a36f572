"""The published configurations of the five families, for ``--model <name>-shape`` (random weights).

Each entry is the model's own config.json on the Hugging Face hub, in the fields that set a
parameter's shape or the routing (hidden size, layers, heads, experts, top-k, expert widths,
vocabulary); the rest are transformers' defaults. ``--layers N`` keeps the widths and builds N
decoder layers, so tests and benchmarks run the real per-layer sizes at reduced depth. The
token ids are the byte tokenizer's (pad/bos/eos 0/1/2): the shape models are trained with it.

    olmoe-1b-7b-shape         allenai/OLMoE-1B-7B-0924           6.92 B parameters (16 layers)
    qwen1.5-moe-a2.7b-shape   Qwen/Qwen1.5-MoE-A2.7B            14.32 B (24 layers)
    qwen3-moe-30b-a3b-shape   Qwen/Qwen3-30B-A3B                30.53 B (48 layers)
    mixtral-8x7b-shape        mistralai/Mixtral-8x7B-v0.1       46.70 B (32 layers)
    deepseek-v3-shape         deepseek-ai/DeepSeek-V3          671.03 B (61 layers, no MTP layer)
"""

from __future__ import annotations

TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)

SHAPES = {
    "olmoe-1b-7b-shape": (
        "olmoe",
        dict(
            hidden_size=2048,
            intermediate_size=1024,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=64,
            num_experts_per_tok=8,
            vocab_size=50304,
            max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            norm_topk_prob=False,
            router_aux_loss_coef=0.01,
        ),
    ),
    "qwen1.5-moe-a2.7b-shape": (
        "qwen2_moe",
        dict(
            hidden_size=2048,
            intermediate_size=5632,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=60,
            num_experts_per_tok=4,
            vocab_size=151936,
            max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            norm_topk_prob=False,
            qkv_bias=True,
            decoder_sparse_step=1,
            router_aux_loss_coef=0.001,
        ),
    ),
    "qwen3-moe-30b-a3b-shape": (
        "qwen3_moe",
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            vocab_size=151936,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            router_aux_loss_coef=0.001,
        ),
    ),
    "mixtral-8x7b-shape": (
        "mixtral",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            vocab_size=32000,
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            router_aux_loss_coef=0.02,
        ),
    ),
    "deepseek-v3-shape": (
        "deepseek_v3",
        dict(
            hidden_size=7168,
            intermediate_size=18432,
            moe_intermediate_size=2048,
            num_hidden_layers=61,
            first_k_dense_replace=3,
            n_routed_experts=256,
            n_shared_experts=1,
            num_experts_per_tok=8,
            n_group=8,
            topk_group=4,
            num_attention_heads=128,
            num_key_value_heads=128,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            vocab_size=129280,
            max_position_embeddings=163840,
            rms_norm_eps=1e-6,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        ),
    ),
}


def shape_config(name: str, layers: int | None = None):
    """The ``transformers`` config of the published shape ``name``, with ``layers`` decoder layers
    (None: the published depth). DeepSeek-V3 keeps its first 3 layers dense, or N - 1 of N when
    N <= 3, so that at least one layer routes."""
    from transformers import AutoConfig

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; one of {sorted(SHAPES)}")
    model_type, fields = SHAPES[name]
    fields = {**fields, **TOKENS}
    if layers is not None:
        if "first_k_dense_replace" in fields:
            fields["first_k_dense_replace"] = min(fields["first_k_dense_replace"], layers - 1)
        fields["num_hidden_layers"] = layers
    return AutoConfig.for_model(model_type, **fields)
