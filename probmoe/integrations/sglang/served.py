"""SGLang's model class of a family, built with a checkpoint's routing rule (sglang is not imported here).

``served(stock_cls, module, standard)`` subclasses SGLang's stock class ``stock_cls`` (of the module
``module`` of ``sglang.srt.models``). Its ``__init__`` reads the checkpoint's rule
(``probmoe.integrations.vllm.settings.serving_rule`` on ``config._name_or_path``, the directory
SGLang read ``config.json`` from) and, while the stock ``__init__`` runs, hands every ``TopK`` the
module builds the rule's width (``top_k``), its routing function (``custom_routing_function``, from
``probmoe.integrations.vllm.routing``; the layer's aux-free bias closed over it) and SGLang's
standard output format (``output_format=standard``: otherwise a ``triton_kernels`` or FlashInfer
runner picks a format whose kernels route by themselves and never call the function), and every
fused-MoE layer the same width. Nothing else of the stock model changes. Its ``load_weights``
drops the routing state of ``probmoe_state.safetensors`` (tensors named ``*.probmoe_*``: ReMoE's
λ, DefaultMoE's Ê, the aux-free bias and loads), which SGLang's loader reads with the weights.

A checkpoint without ``probmoe_routing.json``, or whose rule is the stock top-k, is built exactly
as stock. What the package cannot serve stops the load: ``ServingSettingsError`` for the
checkpoint (naming the file and value), ``RuntimeError`` for an SGLang setup the rule cannot run in.
"""

from __future__ import annotations

import contextlib
import os

import torch

from ..vllm import routing, settings
from ..vllm.settings import ServingSettingsError

TESTED = "sglang 0.5.23"
STATE_PREFIX = "probmoe_"  # the routing state's tensors: <module path>.probmoe_<name>


def is_state(name: str) -> bool:
    """A tensor of ``probmoe_state.safetensors`` (its last name starts with ``probmoe_``)."""
    return name.rsplit(".", 1)[-1].startswith(STATE_PREFIX)


def drop_state(weights):
    """The (name, tensor) pairs of ``weights`` less the probmoe routing state."""
    return ((name, w) for name, w in weights if not is_state(name))


def checkpoint_rule(hf_config) -> settings.Rule | None:
    """The rule of the checkpoint whose ``config.json`` ``hf_config`` was read from (None: stock)."""
    path = getattr(hf_config, "_name_or_path", "") or ""
    if not os.path.isdir(path):
        raise ServingSettingsError(
            f"model path {path!r} is not a local directory: the probmoe SGLang package reads {settings.FILENAME} "
            "from local directories only; download the checkpoint (e.g. huggingface-cli download) and serve "
            "that directory, or unset SGLANG_EXTERNAL_MODEL_PACKAGE to serve it stock"
        )
    rule = settings.serving_rule(path, hf_config)
    if rule is not None and rule.ungrouped:  # DeepSeek-V3's ProbMoE rule: its groups and bias off
        raise settings.ServingSettingsError(
            f"{rule.path}: method {rule.method!r} on model type {hf_config.model_type!r} routes without the "
            "family's expert groups and correction bias; the vLLM plugin serves that rule (docs/serving.md), "
            "this SGLang package does not yet (SGLang's TopK takes no custom_routing_function beside grouped top-k)"
        )
    return rule


def _bias(rule: settings.Rule, layer: int):
    """Layer ``layer``'s selection bias [N] float32 on the device the model is built on, or None."""
    if rule.bias is None:
        return None
    if layer not in rule.bias:
        raise ServingSettingsError(
            f"{rule.path} says balance 'aux-free', but {settings.STATE_FILENAME} holds no probmoe_bias "
            f"of layer {layer} (it has layers {sorted(rule.bias)})"
        )
    bias = torch.tensor(rule.bias[layer], dtype=torch.float32)  # SGLang builds under `with torch.device(...)`
    if bias.is_meta:
        raise RuntimeError(
            "probmoe: the model is built on the meta device (--load-format layered), where the aux-free "
            "selection bias cannot be placed; serve with the default --load-format"
        )
    return bias


def _refuse(where: str, what: str):
    raise RuntimeError(f"probmoe: {where} {what}; {TESTED} with its default MoE runner is the tested setup")


@contextlib.contextmanager
def routed(module, rule: settings.Rule, standard):
    """Within the block, ``module``'s ``TopK`` and fused-MoE layers are built for ``rule``; yields
    the list of the TopK layers built."""
    where, built = module.__name__, []
    stock_topk = module.TopK

    def topk(*args, **kwargs):
        if args or "top_k" not in kwargs or "layer_id" not in kwargs:
            _refuse(
                where, "calls TopK in a way this package does not know (positional arguments, or no top_k or layer_id)"
            )
        if kwargs.get("use_grouped_topk"):
            _refuse(where, "builds a grouped TopK, which takes no custom_routing_function")
        kwargs["top_k"] = rule.slots
        if not rule.stock:
            kwargs["custom_routing_function"] = routing.routing_function(rule, _bias(rule, kwargs["layer_id"]))
            kwargs["output_format"] = standard
        layer = stock_topk(**kwargs)
        if layer.topk_config.num_shared_topk_slots:
            _refuse(where, "fuses shared experts into the routed top-k, which the rule does not write")
        built.append(layer)
        return layer

    def width(build):
        def experts(*args, **kwargs):
            if kwargs.get("num_fused_shared_experts"):
                _refuse(where, "fuses shared experts into the fused MoE (try --disable-shared-experts-fusion)")
            return build(*args, **{**kwargs, "top_k": rule.slots})

        return experts

    patches = {"TopK": topk}
    if hasattr(module, "FusedMoE"):
        patches["FusedMoE"] = width(module.FusedMoE)
    if hasattr(module, "get_moe_impl_class"):
        stock_impl = module.get_moe_impl_class
        patches["get_moe_impl_class"] = lambda quant_config: width(stock_impl(quant_config))
    saved = {name: getattr(module, name) for name in patches}
    for name, value in patches.items():
        setattr(module, name, value)
    try:
        yield built
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def check(model: torch.nn.Module, topks: list, where: str) -> None:
    """The built model runs its routed TopK layers' output: no runner that routes by itself."""
    if not topks:
        _refuse(where, "built no TopK layer")
    for layer in topks:
        backend = layer.topk_config.runner_backend
        if (
            layer.topk_config.custom_routing_function is not None
            and backend is not None
            and backend.is_triton_kernels()
        ):
            _refuse(where, "runs its MoE with the triton_kernels runner, which routes by itself (--moe-runner-backend)")
    if any(getattr(m, "_use_mega_moe", False) for m in model.modules()):
        _refuse(where, "runs its MoE with the mega-MoE backend, whose width is the config's top-k (--moe-a2a-backend)")


def served(stock_cls, module, standard):
    """SGLang's ``stock_cls`` (of ``module``), routed by the checkpoint's probmoe rule."""

    class Served(stock_cls):
        def __init__(self, config, quant_config=None, prefix: str = "", **kwargs):
            rule = checkpoint_rule(config)
            if rule is None or (rule.stock and rule.slots == config.num_experts_per_tok):
                super().__init__(config=config, quant_config=quant_config, prefix=prefix, **kwargs)
            else:
                with routed(module, rule, standard) as topks:
                    super().__init__(config=config, quant_config=quant_config, prefix=prefix, **kwargs)
                check(self, topks, module.__name__)
            self.probmoe_rule = rule

        def load_weights(self, weights, *args, **kwargs):
            return super().load_weights(drop_state(weights), *args, **kwargs)

    Served.__name__ = Served.__qualname__ = stock_cls.__name__
    Served.__doc__ = (
        f"SGLang's {stock_cls.__name__}, routed by the checkpoint's probmoe rule (probmoe.integrations.sglang)."
    )
    return Served
