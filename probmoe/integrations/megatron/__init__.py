"""ProbMoE routing for Megatron-Core (megatron-core 0.16.1): a ``RouterInterface`` for
``MoESubmodules(router=...)``; see docs/scale-out.md for what was and was not run (CPU only here).

    ProbMoEMegatronRouter   forward(hidden [S, B, H]) -> (probs [S·B, E], routing_map [S·B, E] bool)
    probmoe_router(...)     a ``RouterBuilder`` with the ProbMoE options bound, for ``MoESubmodules``
"""

from __future__ import annotations

from .router import ProbMoEMegatronRouter, probmoe_router

__all__ = ["ProbMoEMegatronRouter", "probmoe_router"]
