"""The transformers 5.x MoE families that can be patched, and how to find their MoE blocks.

All share one layout (checked on transformers 5.23): every MoE layer is a block (``*SparseMoeBlock``;
DeepSeek-V3: ``DeepseekV3MoE``) with ``gate`` (a router whose forward returns ``(router_logits [T, N],
top_k_weights [T, k], top_k_index [T, k])``: ``*TopKRouter``, ``DeepseekV3TopkRouter``) and
``experts`` (one fused module with 3-D weights that dispatches on ``config._experts_implementation``;
its forward takes ``(hidden_states, top_k_index, top_k_weights)``).

The families and their facts are rows of ``probmoe.integrations.model_families`` (their one home).
Everything of that layout this package relies on is looked up through ``Family`` and checked
before a model is patched (``check_block``); what a release moved or renamed is a ``LayoutError``
naming the family, the transformers version and the missing class, attribute or config field.

``SUPPORTED``: the softmax-gated families (OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral, FlexOlmo), every
method of ``METHODS``. ``GROUPED``: families whose stock router limits each token to
``topk_group`` of ``n_group`` expert groups (DeepSeek-V3: sigmoid scores, a selection-only bias,
a routed scaling factor), which also take the method "probmoe-grouped".
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, fields

from torch import nn

from ..model_families import ALL, GROUPED, SUPPORTED, TABLE, FamilyFacts  # noqa: F401 (GROUPED, SUPPORTED: exported here)


class LayoutError(RuntimeError):
    """The installed transformers lacks a class, attribute or config field a family is patched through."""


def layout_error(model_type: str, what: str) -> LayoutError:
    import transformers

    from .version import TESTED

    return LayoutError(
        f"{model_type}: {what} in transformers {transformers.__version__}; "
        f"probmoe.integrations.transformers relies on it (tested with transformers "
        f"{' and '.join(TESTED)})"
    )


@dataclass(frozen=True)
class Family(FamilyFacts):
    """A row of ``probmoe.integrations.model_families.TABLE`` (its fields are documented there), with
    what the integration looks up through it in the installed transformers."""

    @property
    def modeling(self):
        name = f"transformers.models.{self.model_type}.modeling_{self.model_type}"
        try:
            return importlib.import_module(name)
        except ImportError as e:
            raise layout_error(self.model_type, f"the module {name} cannot be imported ({e})") from e

    def _class(self, name: str) -> type[nn.Module]:
        cls = getattr(self.modeling, name, None)
        if not isinstance(cls, type):
            raise layout_error(self.model_type, f"{self.modeling.__name__} has no class {name!r}")
        return cls

    @property
    def router_class(self) -> type[nn.Module]:
        return self._class(f"{self.prefix}{self.router}")

    @property
    def block_class(self) -> type[nn.Module]:
        return self._class(f"{self.prefix}{self.block}")

    def field(self, config, name: str):
        """``config.<name>``; LayoutError naming the family and the field if the config has none."""
        if not hasattr(config, name):
            raise layout_error(self.model_type, f"the config ({type(config).__name__}) has no field {name!r}")
        return getattr(config, name)

    def num_experts(self, config) -> int:
        return int(self.field(config, self.experts_attr))

    def top_k(self, config) -> int:
        return int(self.field(config, "num_experts_per_tok"))

    def normalize(self, config) -> bool:
        return True if self.always_normalize else bool(self.field(config, "norm_topk_prob"))

    def scale(self, config) -> float:
        """The factor the router multiplies its used weights by (``routed_scaling_factor``; else 1)."""
        return float(self.field(config, "routed_scaling_factor")) if self.grouped else 1.0

    def groups(self, config) -> tuple[int, int]:
        """(n_group, topk_group) of a grouped family's config."""
        return int(self.field(config, "n_group")), int(self.field(config, "topk_group"))

    def check_block(self, block: nn.Module, name: str) -> None:
        """LayoutError unless the MoE block ``name`` has what patching uses: ``gate``, an instance of
        the router class with a 2-D ``weight`` [N, D] and ``hidden_dim``, and ``experts``, whose
        forward takes (hidden_states, top_k_index, top_k_weights)."""
        where = f"{type(block).__name__} {name!r}"
        for attr in ("gate", "experts"):
            if not isinstance(getattr(block, attr, None), nn.Module):
                raise layout_error(self.model_type, f"{where} has no submodule {attr!r}")
        if not isinstance(block.gate, self.router_class):
            raise layout_error(
                self.model_type, f"{where}.gate is a {type(block.gate).__name__}, not a {self.router_class.__name__}"
            )
        weight = getattr(block.gate, "weight", None)
        if not isinstance(weight, nn.Parameter) or weight.dim() != 2:
            raise layout_error(
                self.model_type, f"{where}.gate ({type(block.gate).__name__}) has no 2-D Parameter 'weight'"
            )
        if getattr(block.gate, "hidden_dim", None) != weight.shape[1]:
            raise layout_error(
                self.model_type,
                f"{where}.gate ({type(block.gate).__name__}) has no attribute "
                f"'hidden_dim' equal to its weight's {weight.shape[1]} columns",
            )
        params = list(inspect.signature(block.experts.forward).parameters)
        if params[:3] != ["hidden_states", "top_k_index", "top_k_weights"]:
            raise layout_error(
                self.model_type,
                f"{where}.experts ({type(block.experts).__name__}) forward takes "
                f"{params}, not (hidden_states, top_k_index, top_k_weights)",
            )

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's MoE blocks in module order (Qwen's dense ``mlp_only_layers`` are skipped)."""
        cls = self.block_class
        return [m for m in model.modules() if isinstance(m, cls)]


FAMILIES = {name: Family(**{f.name: getattr(facts, f.name) for f in fields(facts)}) for name, facts in TABLE.items()}


def family_of(model) -> Family:
    """The family of a transformers model; ValueError naming ``model`` and the supported types."""
    import transformers

    if not isinstance(model, transformers.PreTrainedModel):
        raise ValueError(
            f"model must be a transformers PreTrainedModel of type {', '.join(ALL)}; "
            f"got {type(model).__module__}.{type(model).__qualname__}"
        )
    model_type = getattr(model.config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"model type {model_type!r} is not supported; model must be of type {', '.join(ALL)}")
    return FAMILIES[model_type]
