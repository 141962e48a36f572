"""The architecture name a checkpoint's config.json carries: stock where a stock engine runs its rule.

A checkpoint ``save_pretrained`` of a patched model writes is named as the stock model
(``OlmoeForCausalLM``) when an engine without probmoe serves it with the rule it was trained and
evaluated with: the method's eval is the family's own top-k at the config's ``num_experts_per_tok``
with no selection bias of probmoe's own (``stock_served``). Any other checkpoint is named
``ProbMoE`` + the stock name (``ProbMoEOlmoeForCausalLM``), a name no stock engine knows: stock
vLLM refuses it ("Model architectures ['ProbMoEOlmoeForCausalLM'] are not supported"), instead of
serving it silently with the stock top-k; probmoe's vLLM plugin registers the names of the families
it serves (``probmoe.integrations.vllm``). Transformers loads by ``model_type``, whatever the name.

A plain module (no torch, transformers or vllm import).
"""

from __future__ import annotations

from probmoe.methods import get_method

from .model_families import SERVED, TABLE

PREFIX = "ProbMoE"


def probmoe_name(stock_name: str) -> str:
    """``ProbMoE`` + the stock architecture name."""
    return PREFIX + stock_name


def stock_name(name: str) -> str:
    """The stock architecture of a (probmoe or stock) name."""
    return name.removeprefix(PREFIX)


SERVED_NAMES = tuple(probmoe_name(TABLE[t].architecture) for t in SERVED)  # the plugin registers these


def stock_served(model_type: str, method: str, routing, top_k: int, num_experts: int, balanced: bool) -> bool:
    """An engine without probmoe runs this checkpoint's rule: a method whose eval is the family's stock
    router (a family with expert groups, DeepSeek-V3: the top-k methods, whose aux-free bias is the
    stock e_score_correction_bias), or elsewhere a method served as the stock top-k at the config's
    top-k without a selection bias (``Method.serving``)."""
    rules = get_method(method)
    if TABLE[model_type].grouped:
        return rules.stock(False)
    serving = rules.serving(routing, top_k, num_experts, balanced)
    return serving is not None and serving.kind == "topk" and serving.slots == top_k and not balanced
