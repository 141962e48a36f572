"""ProbMoE routing in torchtitan 0.3.0 (pinned: ``version.SUPPORTED``; docs/scale-out.md).

    ProbMoERouter        a ``TokenChoiceTopKRouter`` subclass with its own ``Config`` (Exact-k,
                         Dynamic-k, softmax or sigmoid scores, group-limited, the aux-free bias)
    use_probmoe          swap every router of a model config for it, in one call
    router_stats         experts per token, load CV and MaxVio of each ProbMoE router's last forward
    count_used_slots     make MoE.tokens_per_expert_E (the aux-free bias update's input) count used slots only
    parallel             the per-rank generator, the EP degree check, torchtitan's EP plan on a model
    reference.dense_moe  every expert on every token, masked by the routing weights (the test oracle)
    config_registry      torchtitan's own entry: ``torchrun -m torchtitan.train --module
                         probmoe.integrations.torchtitan --config probmoe_qwen3_moe_debug`` (needs
                         torchdata); ``trainer.ProbMoETrainer``, ``cpu`` (its CPU set-up)

Importing this package checks the installed torchtitan's version first: anything but the pin is an
ImportError naming both.
"""

from __future__ import annotations

from . import version as _version

_version.check(_version.installed())

from .parallel import check_expert_parallel, rank_generator, rank_seed  # noqa: E402
from .router import ProbMoERouter  # noqa: E402
from .stats import count_used_slots, router_stats  # noqa: E402
from .swap import use_probmoe  # noqa: E402

__all__ = [
    "ProbMoERouter",
    "check_expert_parallel",
    "count_used_slots",
    "rank_generator",
    "rank_seed",
    "router_stats",
    "use_probmoe",
]
