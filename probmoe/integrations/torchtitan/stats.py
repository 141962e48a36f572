"""The routing statistics of a torchtitan model's ProbMoE routers, from their last forward: experts per
token, load CV and MaxVio (``probmoe.analysis.metrics``), counted over the used slots only
(torchtitan's own ``MoE.tokens_per_expert_E`` counts all top_k slots, a Dynamic-k token's unused
slots included)."""

from __future__ import annotations

import torch

from probmoe.analysis.metrics import expert_load, load_cv, max_vio

from .router import ProbMoERouter


def router_stats(model: torch.nn.Module) -> dict[str, dict[str, float]]:
    """{router module name: {"experts_per_token", "load_cv", "max_vio"}} for every ``ProbMoERouter``
    in ``model`` that has routed (the load of this process's tokens; all-reduce it for the global one)."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, ProbMoERouter) and module.last_routing is not None:
            routing = module.last_routing
            load = expert_load(routing.selected())  # [E]
            out[name] = {"experts_per_token": float(routing.counts.double().mean()),
                         "load_cv": load_cv(load), "max_vio": max_vio(load)}
    return out
