"""A tiny torchtitan Qwen3-MoE model config that runs on a CPU: torchtitan's own Qwen3-MoE blocks
(``qwen3._build_qwen3_moe_layers``), 2 layers, 4 heads of 16 (2 for keys and values), expert width 64,
with SDPA causal attention in place of FlexAttention (torch's FlexAttention has no CPU backward).
The sizes that differ between its users are arguments: ``probmoe_qwen3_moe_tiny`` (torchtitan's own
entry) and ``tools/torchtitan_gsm8k.py`` (the EP training tool) build from it. Routers are
torchtitan's; the caller swaps them (``use_probmoe``)."""

from __future__ import annotations

HEAD_DIM = 16


def tiny_qwen3_moe(*, vocab: int, dim: int, num_experts: int, top_k: int, max_seq_len: int, fuse_qkv: bool = False):
    """A ``qwen3.Qwen3Model.Config`` of vocabulary ``vocab``, width ``dim``, ``num_experts`` experts
    with ``top_k`` of them per token, rotary positions up to ``max_seq_len``, one fused QKV
    projection if ``fuse_qkv``."""
    from torchtitan.models import qwen3
    from torchtitan.models.common import Embedding, Linear
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.common.rope import CosSinRoPE

    model = qwen3.Qwen3Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=qwen3._qwen3_norm(dim),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=qwen3._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=qwen3._LINEAR_INIT),
        layers=qwen3._build_qwen3_moe_layers(
            fuse_qkv=fuse_qkv,
            n_layers=2,
            dim=dim,
            n_heads=4,
            n_kv_heads=2,
            head_dim=HEAD_DIM,
            moe_hidden_dim=64,
            num_experts=num_experts,
            top_k=top_k,
            attn_backend="flex",
            moe_comm_backend="standard",
            rope=CosSinRoPE.Config(dim=HEAD_DIM, max_seq_len=max_seq_len, theta=1e6),
        ),
    )
    for _, _, parent, attr in list(model.traverse(FlexAttention.Config)):
        setattr(parent, attr, ScaledDotProductAttention.Config())
    return model
