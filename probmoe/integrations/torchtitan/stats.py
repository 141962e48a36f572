"""The routing statistics of a torchtitan model's ProbMoE routers, from their last forward: experts per
token, load CV and MaxVio (``probmoe.analysis.metrics``), counted over the used slots only; and
``count_used_slots``, which makes torchtitan's own load counter ``MoE.tokens_per_expert_E`` (what its
aux-free bias update reads) count them only too: ``MoE.forward`` counts all top_k slots, a Dynamic-k
token's unused ones included."""

from __future__ import annotations

import torch
from torchtitan.models.common.moe import MoE

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
            out[name] = {
                "experts_per_token": float(routing.counts.double().mean()),
                "load_cv": load_cv(load),
                "max_vio": max_vio(load),
            }
    return out


def count_used_slots(model: torch.nn.Module) -> list:
    """Make every ``MoE`` of ``model`` routed by a ``ProbMoERouter`` count only the used slots in
    ``tokens_per_expert_E``: a forward hook takes back what ``MoE.forward`` added for the unused
    ones (training forwards only, as ``MoE.forward`` counts; a checkpoint recomputation counts and
    takes back again, so the counter stays consistent). Returns the hook handles."""
    return [
        moe.register_forward_hook(_take_back_unused)
        for moe in model.modules()
        if isinstance(moe, MoE) and isinstance(moe.router, ProbMoERouter)
    ]


def _take_back_unused(moe, args, output) -> None:
    routing = moe.router.last_routing
    if not moe.training or routing is None:
        return
    counter = moe.tokens_per_expert_E
    counter = counter.to_local() if hasattr(counter, "to_local") else counter
    with torch.no_grad():
        unused = torch.bincount(routing.indices[~routing.mask], minlength=counter.shape[0])  # [E]
        counter.sub_(unused.to(counter.dtype))
