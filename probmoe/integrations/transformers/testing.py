"""Tiny randomly initialised models of the four families, for tests, examples and benchmarks.

hidden 64, 2 layers, 8 experts, top-2, vocab 256, intermediate 128, 4 heads / 2 kv heads,
pad/bos/eos 0/1/2: each builds in milliseconds on a CPU.
"""

from __future__ import annotations

import torch

from .families import SUPPORTED

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, num_experts_per_tok=2,
              max_position_embeddings=128)
EXTRA = {
    "olmoe": dict(num_experts=8),
    "qwen2_moe": dict(num_experts=8, moe_intermediate_size=128, shared_expert_intermediate_size=128),
    "qwen3_moe": dict(num_experts=8, moe_intermediate_size=128),
    "mixtral": dict(num_local_experts=8),
}


def tiny_config(model_type: str, **overrides):
    from transformers import AutoConfig

    if model_type not in SUPPORTED:
        raise ValueError(f"model_type must be one of {SUPPORTED}, got {model_type!r}")
    return AutoConfig.for_model(model_type, **{**COMMON, **EXTRA[model_type], **overrides})


def tiny_model(model_type: str, seed: int = 0, **overrides):
    """A ``*ForCausalLM`` with weights drawn under ``torch.manual_seed(seed)``."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides))
