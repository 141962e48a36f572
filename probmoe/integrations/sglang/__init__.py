"""Serving probmoe checkpoints in SGLang with each method's own inference rule (docs/serving-sglang.md).

An out-of-tree model package: with ``SGLANG_EXTERNAL_MODEL_PACKAGE=probmoe.integrations.sglang.models``
SGLang takes its classes for the architectures below (``models.families``), each SGLang's stock
class of the family built with the routing that the checkpoint's ``probmoe_routing.json``
describes (``served``). The rule is the vLLM plugin's (``probmoe.integrations.vllm.settings``
reads it, ``probmoe.integrations.vllm.routing`` computes it; both import neither vLLM nor
transformers), handed to SGLang's ``TopK`` as its ``custom_routing_function``.

Importing this package imports neither sglang nor transformers; ``models`` imports sglang.
"""

from types import MappingProxyType

from ..model_families import TABLE

# model type -> the module of ``sglang.srt.models`` that holds the family's architecture (sglang
# 0.5.23). FlexOlmo has none there (SGLang would run it through its transformers backend, unrouted).
MODULES = MappingProxyType(
    {
        "olmoe": "olmoe",
        "qwen2_moe": "qwen2_moe",
        "qwen3_moe": "qwen3_moe",
        "mixtral": "mixtral",
        "deepseek_v3": "deepseek_v2",
    }
)
FAMILIES = tuple(t for t in TABLE if t in MODULES)  # in the family table's order
ARCHITECTURES = tuple(TABLE[t].architecture for t in FAMILIES)
PACKAGE = "probmoe.integrations.sglang.models"  # the value of SGLANG_EXTERNAL_MODEL_PACKAGE
