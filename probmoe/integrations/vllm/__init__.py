"""Serving probmoe checkpoints in vLLM with each method's own inference rule (docs/serving.md).

A vLLM general plugin: ``register`` (the ``vllm.general_plugins`` entry point ``probmoe``) puts
``models``' classes in vLLM's model registry under the stock architecture names of OLMoE,
Qwen2-MoE, Qwen3-MoE, Mixtral and DeepSeek-V3. Each is the stock vLLM class, built with the
routing that the checkpoint's ``probmoe_routing.json`` describes (``settings.serving_rule``;
``routing`` computes it): a checkpoint without that file is served exactly as stock.

It needs probmoe's core and vllm only, never ``probmoe.integrations.transformers`` (vLLM pins a
transformers release that integration refuses). Importing this package imports neither vllm
nor transformers; ``register`` and ``models`` import vllm.
"""

ARCHITECTURES = (
    "OlmoeForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
    "DeepseekV3ForCausalLM",
)


def register() -> None:
    """vLLM's plugin hook (run once per vLLM process): the probmoe classes for ``ARCHITECTURES``."""
    from vllm import ModelRegistry

    for arch in ARCHITECTURES:
        ModelRegistry.register_model(arch, f"probmoe.integrations.vllm.models:{arch}")
