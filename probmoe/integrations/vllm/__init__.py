"""Serving probmoe checkpoints in vLLM with each method's own inference rule (docs/serving.md).

A vLLM general plugin: ``register`` (the ``vllm.general_plugins`` entry point ``probmoe``) puts
``models``' classes in vLLM's model registry under the stock architecture names of the families
``probmoe.integrations.model_families`` serves (OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V3). Each is the stock vLLM class, built with the
routing that the checkpoint's ``probmoe_routing.json`` describes (``settings.serving_rule``;
``routing`` computes it): a checkpoint without that file is served exactly as stock. The same
classes are registered under the probmoe names (``ProbMoEOlmoeForCausalLM``, ...) that
``save_pretrained`` writes where no stock engine serves a checkpoint's rule
(``probmoe.integrations.architectures``): stock vLLM refuses those, the plugin serves them.

It needs probmoe's core and vllm only, never ``probmoe.integrations.transformers`` (vLLM pins a
transformers release that integration refuses). Importing this package imports neither vllm
nor transformers; ``register`` and ``models`` import vllm.
"""

from ..architectures import SERVED_NAMES
from ..model_families import SERVED, TABLE

ARCHITECTURES = tuple(TABLE[t].architecture for t in SERVED)  # probmoe.integrations.model_families
PROBMOE_ARCHITECTURES = SERVED_NAMES  # the checkpoints stock engines must refuse


def register() -> None:
    """vLLM's plugin hook (run once per vLLM process): the probmoe classes for ``ARCHITECTURES`` and
    ``PROBMOE_ARCHITECTURES``."""
    from vllm import ModelRegistry

    for arch in ARCHITECTURES + PROBMOE_ARCHITECTURES:
        ModelRegistry.register_model(arch, f"probmoe.integrations.vllm.models:{arch}")
