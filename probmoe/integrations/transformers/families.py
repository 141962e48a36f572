"""The transformers 5.x MoE families that can be patched, and how to find their MoE blocks.

All four share one layout (checked on transformers 5.23): every MoE layer is a
``*SparseMoeBlock`` with ``gate`` (a ``*TopKRouter`` whose forward returns
``(router_logits [T, N], top_k_weights [T, k], top_k_index [T, k])``) and ``experts`` (one fused
module with 3-D weights that dispatches on ``config._experts_implementation``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Family:
    """One model family.

    model_type: ``config.model_type``.
    prefix: the class-name prefix in ``transformers.models.<model_type>.modeling_<model_type>``.
    experts_attr: the config field holding the number of routed experts.
    always_normalize: the router always renormalises its top-k weights (Mixtral); otherwise it
        follows ``config.norm_topk_prob``.
    fp32_weights: the router returns float32 weights whatever the logits' dtype (Mixtral); the
        others cast their weights to the logits' dtype.
    """

    model_type: str
    prefix: str
    experts_attr: str
    always_normalize: bool
    fp32_weights: bool

    @property
    def modeling(self):
        return importlib.import_module(f"transformers.models.{self.model_type}.modeling_{self.model_type}")

    @property
    def router_class(self) -> type[nn.Module]:
        return getattr(self.modeling, f"{self.prefix}TopKRouter")

    @property
    def block_class(self) -> type[nn.Module]:
        return getattr(self.modeling, f"{self.prefix}SparseMoeBlock")

    def num_experts(self, config) -> int:
        return int(getattr(config, self.experts_attr))

    def top_k(self, config) -> int:
        return int(config.num_experts_per_tok)

    def normalize(self, config) -> bool:
        return True if self.always_normalize else bool(config.norm_topk_prob)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's MoE blocks in module order (Qwen's dense ``mlp_only_layers`` are skipped)."""
        cls = self.block_class
        return [m for m in model.modules() if isinstance(m, cls)]


FAMILIES = {
    f.model_type: f
    for f in (
        Family("olmoe", "Olmoe", "num_experts", always_normalize=False, fp32_weights=False),
        Family("qwen2_moe", "Qwen2Moe", "num_experts", always_normalize=False, fp32_weights=False),
        Family("qwen3_moe", "Qwen3Moe", "num_experts", always_normalize=False, fp32_weights=False),
        Family("mixtral", "Mixtral", "num_local_experts", always_normalize=True, fp32_weights=True),
    )
}
SUPPORTED = tuple(FAMILIES)


def family_of(model) -> Family:
    """The family of a transformers model; ValueError naming ``model`` and the supported types."""
    import transformers

    if not isinstance(model, transformers.PreTrainedModel):
        raise ValueError(f"model must be a transformers PreTrainedModel of type {', '.join(SUPPORTED)}; "
                         f"got {type(model).__module__}.{type(model).__qualname__}")
    model_type = getattr(model.config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"model type {model_type!r} is not supported; model must be of type "
                         f"{', '.join(SUPPORTED)}")
    return FAMILIES[model_type]
