"""``use_probmoe``: swap every router of a torchtitan model config for ``ProbMoERouter`` in one call."""

from __future__ import annotations

from dataclasses import fields

from torchtitan.models.common.moe import MoE, TokenChoiceTopKRouter

from .parallel import check_expert_parallel
from .router import ProbMoERouter


def use_probmoe(
    model_config,
    *,
    kmin: int | None = None,
    top_k: int | None = None,
    estimator: str | None = None,
    algorithm: str | None = None,
    grad: str = "exact",
    seed: int | None = None,
    expert_parallel_degree: int | None = None,
    method: str | None = None,
    backend: str | None = None,
):
    """Replace every ``TokenChoiceTopKRouter.Config`` in ``model_config`` (a torchtitan model config,
    an ``MoE.Config``, or a router config itself) by a ``ProbMoERouter.Config`` with the same fields
    (experts, gate, groups, score function, normalisation, scale) and the ProbMoE ones given here
    (``top_k``: a new kmax, default the model's; ``kmin``: Dynamic-k between kmin and top_k).
    Returns the config (the same object, changed in place, unless it was a router config). The
    routed experts' dispatcher gets the new top_k. ``method``, ``backend``: the old names of
    ``estimator`` and ``algorithm`` (a DeprecationWarning). ``expert_parallel_degree``: checked to divide
    every MoE's experts. ValueError if the config has no router, or for any bad value (naming it)."""
    words = dict(estimator=estimator, algorithm=algorithm, method=method, backend=backend)  # checked by the Config
    swapped = []
    for fqn, cfg, parent, attr in list(model_config.traverse(TokenChoiceTopKRouter.Config)):
        values = {f.name: getattr(cfg, f.name) for f in fields(TokenChoiceTopKRouter.Config) if f.init}
        if top_k is not None:
            values["top_k"] = top_k
        new = ProbMoERouter.Config(**values, kmin=kmin, **words, grad=grad, seed=seed)
        swapped.append(fqn)
        if parent is None:
            return new
        if isinstance(parent, (list, dict)):
            parent[attr] = new
        else:
            setattr(parent, attr, new)
    if not swapped:
        raise ValueError(f"model_config ({type(model_config).__name__}) has no TokenChoiceTopKRouter.Config to swap")
    for fqn, moe, _, _ in model_config.traverse(MoE.Config):
        if moe.num_experts != moe.router.num_experts:
            raise ValueError(f"{fqn}: MoE num_experts = {moe.num_experts} but its router has {moe.router.num_experts}")
        moe.routed_experts.token_dispatcher.top_k = moe.router.top_k
        if expert_parallel_degree is not None:
            check_expert_parallel(moe.num_experts, expert_parallel_degree, fqn or "the MoE")
    return model_config
